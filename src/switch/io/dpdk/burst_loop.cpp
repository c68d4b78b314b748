// The DPDK switch's packet path: each lcore's loop, top to bottom.
//
//   receive     rx<p>: a burst from each of its ports; each frame is parsed (frames.cpp) and
//               learned from, then handed to aggregation, answered (ARP), dropped or switched
//   aggregate   agg<k>: data packets from this lcore's receive and from the ring, through the
//               engine; each result becomes one frame per receiving worker
//   transmit    tx<p>: frames from other lcores' rings, and everything buffered, to the ports
// A producer on the consumer's own lcore skips the ring (calls the engine or buffers the frame).
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/clock.h"
#include "switch/io/dpdk/checksum.h"
#include "switch/io/dpdk/dpdk_switch.h"

namespace gradswitch::dpdk {
namespace {

constexpr unsigned kIdlePollsBeforeSleep = 64;
constexpr uint64_t kArpRequestGapNs = 10'000'000;  // at most one ARP request per 10 ms per lcore

void refresh_clock(Lcore& lc) {
  lc.now_ns = monotonic_ns();
  lc.now_s = static_cast<uint32_t>(lc.now_ns / 1'000'000'000);
}

std::atomic<uint64_t>& drop_counter(LcoreCounters& c, FrameDrop why) {
  switch (why) {
    case FrameDrop::kBadIpv4:
      return c.drop_bad_ipv4;
    case FrameDrop::kBadUdp:
      return c.drop_bad_udp;
    case FrameDrop::kIpFragment:
      return c.drop_ip_fragment;
    case FrameDrop::kRunt:
    case FrameDrop::kNone:
      break;
  }
  return c.drop_runt;
}

// The rx task left the gradswitch datagram's offset in the mbuf's header lengths.
const uint8_t* datagram_of(const rte_mbuf* m, uint32_t* len) {
  const uint32_t off = m->l2_len + m->l3_len + m->l4_len;
  *len = m->pkt_len - off;
  return rte_pktmbuf_mtod(m, const uint8_t*) + off;
}

// The datagram's source address, from the IPv4 and UDP headers the rx task checked.
Endpoint source_of(const rte_mbuf* m) {
  const uint8_t* frame = rte_pktmbuf_mtod(m, const uint8_t*);
  Ipv4Header ip;
  UdpHeader udp;
  std::memcpy(&ip, frame + m->l2_len, sizeof ip);
  std::memcpy(&udp, frame + m->l2_len + m->l3_len, sizeof udp);
  return Endpoint{ip.src_be, udp.src_port_be};
}

}  // namespace

void DpdkSwitch::loop(Lcore& lc) {
  const bool is_main = &lc == lcores_[0].get();
  unsigned idle = 0;
  while (!halt_.load(std::memory_order_relaxed)) {
    const uint64_t start = rte_rdtsc();
    refresh_clock(lc);
    unsigned work = receive(lc);
    work += drain_aggregation(lc);
    work += transmit(lc);
    if (work) {
      const uint64_t cycles = rte_rdtsc() - start;
      if (cycles < preempted_cycles_) {
        bump(lc.c.busy_cycles, cycles);
        bump(lc.c.busy_iterations);
        bump(lc.c.busy_frames, work);
      } else {
        bump(lc.c.preempted_iterations);
        bump(lc.c.preempted_frames, work);
      }
      idle = 0;
    } else if (config_.dpdk.idle_sleep_us && ++idle >= kIdlePollsBeforeSleep) {
      usleep(config_.dpdk.idle_sleep_us);
      idle = 0;
    }
    if (is_main) housekeeping(lc);
  }
  for (unsigned p : lc.tx_ports) flush_tx(lc, p);
}

// ---- receive ----

unsigned DpdkSwitch::receive(Lcore& lc) {
  unsigned frames = 0;
  rte_mbuf* burst[kBurst];
  for (unsigned p : lc.rx_ports) {
    const uint16_t n = rte_eth_rx_burst(ports_[p].id, 0, burst, kBurst);
    frames += n;
    if (n) handle_frames(lc, p, burst, n);
  }
  return frames;
}

void DpdkSwitch::handle_frames(Lcore& lc, unsigned port, rte_mbuf** frames, uint16_t n) {
  const uint32_t age = config_.dpdk.mac_age_s;
  for (uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = frames[i];
    bump(lc.c.rx_frames);
    bump(lc.c.rx_bytes, m->pkt_len);
    uint8_t* frame = rte_pktmbuf_mtod(m, uint8_t*);
    // (Chained mbufs are not expected with our pool sizes; they are counted as runts.)
    const PacketDescription d = m->nb_segs == 1 ? classify_frame(frame, m->data_len, rules_)
                                                : PacketDescription{FrameAction::kDrop, FrameDrop::kRunt};
    if (d.learn_mac) macs_->learn(d.src_mac, port, lc.now_s, age);
    if (d.learn_neighbour) neighbours_->learn(d.neighbour_ip_be, d.neighbour_mac, lc.now_s);
    switch (d.action) {
      case FrameAction::kAggregate:
        // Trim Ethernet padding and anything past the UDP length; remember where the datagram is.
        rte_pktmbuf_trim(m, m->pkt_len - d.frame_len);
        m->l2_len = sizeof(EthernetHeader);
        m->l3_len = d.payload_offset - sizeof(EthernetHeader) - sizeof(UdpHeader);
        m->l4_len = sizeof(UdpHeader);
        to_aggregation(lc, d.agg, m);
        break;
      case FrameAction::kArpReply:
        bump(lc.c.arp_replies);
        emit(lc, port, m);
        break;
      case FrameAction::kDrop:
        bump(drop_counter(lc.c, d.drop));
        rte_pktmbuf_free(m);
        break;
      case FrameAction::kSwitch:
        switch_frame(lc, port, m);
        break;
    }
  }
}

void DpdkSwitch::to_aggregation(Lcore& lc, unsigned agg, rte_mbuf* m) {
  if (lc.owns_agg[agg]) {
    lc.inline_m[agg][lc.inline_n[agg]++] = m;
    if (lc.inline_n[agg] == kBurst) {
      aggregate(lc, agg, lc.inline_m[agg], kBurst);
      lc.inline_n[agg] = 0;
    }
  } else if (rte_ring_mp_enqueue(agg_[agg].ring, m) != 0) {
    bump(lc.c.drop_agg_ring_full);
    rte_pktmbuf_free(m);
  }
}

void DpdkSwitch::switch_frame(Lcore& lc, unsigned in_port, rte_mbuf* m) {
  MacAddr dst;
  std::memcpy(dst.bytes, rte_pktmbuf_mtod(m, const uint8_t*), 6);
  const L2Destination to = l2_destination(*macs_, dst, in_port, lc.now_s, config_.dpdk.mac_age_s);
  switch (to.kind) {
    case L2Destination::kFlood:
      bump(lc.c.l2_flooded);
      flood(lc, static_cast<int>(in_port), m);
      break;
    case L2Destination::kFilter:
      bump(lc.c.l2_filtered);
      rte_pktmbuf_free(m);
      break;
    case L2Destination::kForward:
      bump(lc.c.l2_forwarded);
      emit(lc, to.port, m);
      break;
  }
}

// ---- aggregate ----

unsigned DpdkSwitch::drain_aggregation(Lcore& lc) {
  unsigned packets = 0;
  rte_mbuf* burst[kBurst];
  for (unsigned k : lc.aggs) {
    if (lc.inline_n[k]) {
      aggregate(lc, k, lc.inline_m[k], lc.inline_n[k]);
      lc.inline_n[k] = 0;
    }
    const unsigned n =
        rte_ring_sc_dequeue_burst(agg_[k].ring, reinterpret_cast<void**>(burst), kBurst, nullptr);
    packets += n;
    if (n) aggregate(lc, k, burst, n);
  }
  return packets;
}

void DpdkSwitch::aggregate(Lcore& lc, unsigned agg, rte_mbuf** packets, unsigned n) {
  AggThread& at = agg_[agg];
  engine_.begin_burst(agg);
  for (unsigned i = 0; i < n; ++i) {
    rte_mbuf* m = packets[i];
    bump(lc.c.agg_in);
    if (at.loss.drop()) {
      bump(lc.c.drop_injected);
      rte_pktmbuf_free(m);
      continue;
    }
    uint32_t len;
    const uint8_t* datagram = datagram_of(m, &len);
    const IngestResult r = engine_.ingest(agg, datagram, len, lc.now_ns, source_of(m));
    if (r.kind == IngestResult::kSend) {
      bump(lc.c.agg_results);
      send_result(lc, agg, r);
    }
    rte_pktmbuf_free(m);
  }
  engine_.end_burst(agg);
}

void DpdkSwitch::send_result(Lcore& lc, unsigned agg, const IngestResult& r) {
  AggThread& at = agg_[agg];
  const bool to_all = r.dest_rank == GS_RANK_ALL && r.dest_mask == 0;
  uint64_t dests = destinations(r);
  // Results leave from the data port the packets came to (thread `agg`'s).
  const uint16_t src_port_be = htons(static_cast<uint16_t>(config_.data_port + agg));
  const uint64_t payload_sum = udp_checksum_ ? checksum_add(0, r.data, r.len) : 0;
  uint32_t sent = 0;
  for (; dests; dests &= dests - 1) {
    const Endpoint& ep = r.endpoints[__builtin_ctzll(dests)];
    sent += send_udp(lc, ep.ipv4_be, src_port_be, ep.port_be, r.data, r.len, payload_sum, &at.ip_id);
  }
  bump(lc.c.agg_frames_out, sent);
  engine_.count_sent(agg, r.job_id, sent, uint64_t{sent} * r.len);
  // Completion tracking: a multicast RESULT advances the job's seq (answers to retransmissions,
  // sent to one rank, do not).
  if (to_all && r.type == GS_MSG_RESULT)
    at.completion.record(r.job_index, r.job_id, r.seq, r.count, lc.now_ns);
}

// Builds Ethernet/IPv4/UDP around `payload` for `dst_ip_be` and sends it out of the port behind
// the destination's MAC. False (counted) when the neighbour is unknown or no mbuf is left.
bool DpdkSwitch::send_udp(Lcore& lc, uint32_t dst_ip_be, uint16_t src_port_be, uint16_t dst_port_be,
                          const uint8_t* payload, uint32_t len, uint64_t payload_sum, uint16_t* ip_id) {
  UdpFrameAddress a;
  if (!neighbours_->lookup(dst_ip_be, &a.dst_mac, lc.now_s, config_.dpdk.mac_age_s)) {
    bump(lc.c.drop_no_neighbour);
    send_arp_request(lc, dst_ip_be);
    return false;
  }
  const int port = macs_->lookup(a.dst_mac, lc.now_s, config_.dpdk.mac_age_s);
  rte_mbuf* m = rte_pktmbuf_alloc(ports_[port >= 0 ? port : 0].pool);
  if (!m) return bump(lc.c.drop_no_mbuf), false;
  a.src_mac = rules_.agg_mac;
  a.src_ip_be = rules_.agg_ip_be;
  a.dst_ip_be = dst_ip_be;
  a.src_port_be = src_port_be;
  a.dst_port_be = dst_port_be;
  a.ip_id = (*ip_id)++;
  const uint32_t frame = write_udp_frame(rte_pktmbuf_mtod(m, uint8_t*), rte_pktmbuf_tailroom(m), a, payload,
                                         len, payload_sum, udp_checksum_);
  if (frame == 0) {
    rte_pktmbuf_free(m);
    return bump(lc.c.drop_too_big), false;
  }
  m->data_len = m->pkt_len = frame;
  if (port >= 0)
    emit(lc, port, m);
  else
    flood(lc, -1, m);  // the worker's MAC aged out of the port table: flood like any switch
  return true;
}

void DpdkSwitch::send_arp_request(Lcore& lc, uint32_t target_ip_be) {
  if (lc.now_ns - lc.last_arp_ns < kArpRequestGapNs) return;
  lc.last_arp_ns = lc.now_ns;
  rte_mbuf* m = rte_pktmbuf_alloc(ports_[0].pool);
  if (!m) return bump(lc.c.drop_no_mbuf);
  m->data_len = m->pkt_len =
      write_arp_request(rte_pktmbuf_mtod(m, uint8_t*), rules_.agg_mac, rules_.agg_ip_be, target_ip_be);
  bump(lc.c.arp_requests);
  flood(lc, -1, m);
}

// ---- transmit ----

void DpdkSwitch::flood(Lcore& lc, int in_port, rte_mbuf* m) {
  int last = -1;
  for (unsigned q = 0; q < ports_.size(); ++q)
    if (static_cast<int>(q) != in_port) last = static_cast<int>(q);
  if (last < 0) return rte_pktmbuf_free(m);
  for (unsigned q = 0; q < ports_.size(); ++q) {
    if (static_cast<int>(q) == in_port || static_cast<int>(q) == last) continue;
    rte_mbuf* c = rte_pktmbuf_copy(m, ports_[q].pool, 0, UINT32_MAX);
    if (!c) {
      bump(lc.c.drop_no_mbuf);
      continue;
    }
    emit(lc, q, c);
  }
  emit(lc, static_cast<unsigned>(last), m);  // the original goes to the last port: one copy fewer
}

void DpdkSwitch::emit(Lcore& lc, unsigned port, rte_mbuf* m) {
  if (lc.owns_tx[port]) {
    TxBuffer& b = lc.tx[port];
    b.m[b.n++] = m;
    if (b.n == kBurst) flush_tx(lc, port);
    return;
  }
  if (rte_ring_mp_enqueue(ports_[port].tx_ring, m) != 0) {
    bump(lc.c.drop_tx_ring_full);
    rte_pktmbuf_free(m);
  }
}

unsigned DpdkSwitch::transmit(Lcore& lc) {
  unsigned frames = 0;
  for (unsigned p : lc.tx_ports) {
    TxBuffer& b = lc.tx[p];
    const unsigned room = sizeof(b.m) / sizeof(b.m[0]) - b.n;
    const unsigned n = rte_ring_sc_dequeue_burst(ports_[p].tx_ring, reinterpret_cast<void**>(b.m + b.n),
                                                 std::min(room, kBurst * 2), nullptr);
    b.n += n;
    frames += n;
    flush_tx(lc, p);
  }
  return frames;
}

void DpdkSwitch::flush_tx(Lcore& lc, unsigned port) {
  TxBuffer& b = lc.tx[port];
  if (b.n == 0) return;
  uint16_t sent = 0;
  for (int tries = 0; tries < 4 && sent < b.n; ++tries)
    sent += rte_eth_tx_burst(ports_[port].id, 0, b.m + sent, b.n - sent);
  uint64_t bytes = 0;
  for (uint16_t i = 0; i < sent; ++i) bytes += b.m[i]->pkt_len;
  bump(lc.c.tx_frames, sent);
  bump(lc.c.tx_bytes, bytes);
  if (sent < b.n) {
    bump(lc.c.drop_tx_full, b.n - sent);
    rte_pktmbuf_free_bulk(b.m + sent, b.n - sent);
  }
  b.n = 0;
}

}  // namespace gradswitch::dpdk
