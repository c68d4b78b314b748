// gs_dpdk_pktgen: a DPDK frame generator for bench/dpdk_bench.py (one port, one lcore).
//
//   gs_dpdk_pktgen EAL-ARGS -- --mode fwd|agg --size FRAME --seconds T --dst-mac MAC
//        [--src-ip A --dst-ip B --data-port P --threads X --job-id J --key K --world W --slots S]
//
// fwd: blasts FRAME-byte frames (FRAME counts the 4-byte CRC, like 64..1518) of a test ethertype
//      to --dst-mac, as fast as the port takes them.
// agg: plays all W ranks of a job as a closed-loop worker: every free slot gets the next round's
//      W DATA packets (float32, as many elements as FRAME allows); a slot is reused once its RESULT
//      came back (rank 0's copy is received on this port); rounds without result for 20 ms are
//      resent. This is what a real worker window does, so the switch is never fed stale rounds.
// Prints one line: "sent=N received=M seconds=T tx_pps=... rx_pps=... rounds=R".
#include <arpa/inet.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradswitch/wire.h"

int main(int argc, char** argv) {
  int used = rte_eal_init(argc, argv);
  if (used < 0) {
    std::fprintf(stderr, "pktgen: EAL init failed\n");
    return 1;
  }
  argc -= used;
  argv += used;
  std::string mode = "fwd";
  unsigned size = 64, world = 2, slots = 256, threads = 1;
  double seconds = 3;
  rte_ether_addr dst_mac{};
  uint32_t src_ip = 0, dst_ip = 0, job_id = 0, key = 0;
  uint16_t data_port = 7701;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode")
      mode = v;
    else if (k == "--size")
      size = std::atoi(v.c_str());
    else if (k == "--seconds")
      seconds = std::atof(v.c_str());
    else if (k == "--dst-mac")
      rte_ether_unformat_addr(v.c_str(), &dst_mac);
    else if (k == "--src-ip")
      inet_pton(AF_INET, v.c_str(), &src_ip);
    else if (k == "--dst-ip")
      inet_pton(AF_INET, v.c_str(), &dst_ip);
    else if (k == "--data-port")
      data_port = std::atoi(v.c_str());
    else if (k == "--threads")
      threads = std::atoi(v.c_str());
    else if (k == "--job-id")
      job_id = std::strtoul(v.c_str(), nullptr, 0);
    else if (k == "--key")
      key = std::strtoul(v.c_str(), nullptr, 0);
    else if (k == "--world")
      world = std::atoi(v.c_str());
    else if (k == "--slots")
      slots = std::atoi(v.c_str());
  }
  const unsigned frame = size - RTE_ETHER_CRC_LEN;
  rte_mempool* pool = rte_pktmbuf_pool_create(
      "gen", 16383, 256, 0,
      frame + 256 <= RTE_MBUF_DEFAULT_BUF_SIZE ? RTE_MBUF_DEFAULT_BUF_SIZE : 16384 + 128, rte_socket_id());
  if (!pool) {
    std::fprintf(stderr, "pktgen: mempool: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  const uint16_t port = 0;
  rte_eth_conf conf{};
  if (rte_eth_dev_configure(port, 1, 1, &conf) || rte_eth_rx_queue_setup(port, 0, 1024, 0, nullptr, pool) ||
      rte_eth_tx_queue_setup(port, 0, 1024, 0, nullptr) || rte_eth_dev_start(port)) {
    std::fprintf(stderr, "pktgen: port setup failed\n");
    return 1;
  }
  rte_ether_addr src_mac;
  rte_eth_macaddr_get(port, &src_mac);

  // Template frame.
  std::vector<uint8_t> tpl(frame, 0);
  auto* eth = reinterpret_cast<rte_ether_hdr*>(tpl.data());
  eth->dst_addr = dst_mac;
  eth->src_addr = src_mac;
  const unsigned l2l4 = sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr);
  unsigned count = 0;
  if (mode == "agg") {
    if (frame < l2l4 + GS_HEADER_BYTES + 4) {
      std::fprintf(stderr, "pktgen: %u-byte frames cannot carry gradswitch data\n", size);
      return 1;
    }
    count = (frame - l2l4 - GS_HEADER_BYTES) / 4;
    tpl.resize(l2l4 + GS_HEADER_BYTES + count * 4);
    eth = reinterpret_cast<rte_ether_hdr*>(tpl.data());
    eth->ether_type = htons(RTE_ETHER_TYPE_IPV4);
    auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
    ip->version_ihl = RTE_IPV4_VHL_DEF;
    ip->total_length = htons(tpl.size() - sizeof(rte_ether_hdr));
    ip->time_to_live = 64;
    ip->next_proto_id = IPPROTO_UDP;
    ip->src_addr = src_ip;
    ip->dst_addr = dst_ip;
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
    udp->src_port = htons(9000);
    udp->dst_port = htons(data_port);
    udp->dgram_len = htons(tpl.size() - sizeof(rte_ether_hdr) - sizeof(rte_ipv4_hdr));
    float* el = reinterpret_cast<float*>(tpl.data() + l2l4 + GS_HEADER_BYTES);
    for (unsigned i = 0; i < count; ++i) el[i] = 1.0f;
  } else {
    eth->ether_type = htons(0x88B5);
  }
  const unsigned len = tpl.size();

  struct SlotState {
    bool busy = false;
    uint64_t round = 0, sent_tsc = 0;
  };
  std::vector<SlotState> st(slots);
  uint64_t next_round = 0, rounds_done = 0, sent = 0, received = 0, resent = 0;
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t t0 = rte_get_tsc_cycles(), end = t0 + (uint64_t)(seconds * hz), retx_after = hz / 50;
  rte_mbuf* tx[64];
  rte_mbuf* rx[64];
  unsigned ntx = 0;
  auto make = [&](uint16_t rank, uint16_t slot, uint64_t round) -> rte_mbuf* {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (!m) return nullptr;
    uint8_t* d = rte_pktmbuf_mtod(m, uint8_t*);
    std::memcpy(d, tpl.data(), len);
    m->data_len = m->pkt_len = len;
    if (mode == "agg") {
      auto* udp = reinterpret_cast<rte_udp_hdr*>(d + sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr));
      udp->dst_port = htons(data_port + slot % threads);
      gs_header h{};
      h.magic = GS_MAGIC;
      h.version = GS_VERSION;
      h.type = GS_MSG_DATA;
      h.job_id = job_id;
      h.key = key;
      h.rank = rank;
      h.slot = slot;
      h.flags = (round / slots) & 1;
      h.elem_type = GS_ELEM_FLOAT32;
      h.count = count;
      h.seq = 0;
      h.offset = static_cast<uint32_t>(round * count);
      h.next_exp = GS_EXP_NONE;
      h.scale_exp = GS_EXP_NONE;
      gs_header_encode(&h, d + l2l4);
    }
    return m;
  };
  auto flush = [&]() {
    unsigned done = 0;
    while (done < ntx) {
      uint16_t n = rte_eth_tx_burst(port, 0, tx + done, ntx - done);
      done += n;
      if (n == 0) break;
    }
    sent += done;
    if (done < ntx) rte_pktmbuf_free_bulk(tx + done, ntx - done);
    ntx = 0;
  };
  uint64_t now;
  unsigned cursor = 0;
  while ((now = rte_get_tsc_cycles()) < end) {
    uint16_t n = rte_eth_rx_burst(port, 0, rx, 64);
    received += n;
    for (uint16_t i = 0; i < n && mode == "agg"; ++i) {
      const uint8_t* d = rte_pktmbuf_mtod(rx[i], const uint8_t*);
      if (rx[i]->pkt_len >= l2l4 + GS_HEADER_BYTES && d[l2l4 + 3] == GS_MSG_RESULT) {
        gs_header h;
        gs_header_decode(d + l2l4, &h);
        if (h.slot < slots && st[h.slot].busy &&
            h.offset == static_cast<uint32_t>(st[h.slot].round * count)) {
          st[h.slot].busy = false;
          ++rounds_done;
        }
      }
    }
    rte_pktmbuf_free_bulk(rx, n);
    if (mode == "agg") {
      for (unsigned scanned = 0; scanned < slots && ntx + world <= 64;
           ++scanned, cursor = (cursor + 1) % slots) {
        SlotState& s = st[cursor];
        if (s.busy && now - s.sent_tsc < retx_after) continue;
        if (s.busy)
          ++resent;
        else {
          // The next round for this slot keeps rounds and slots in step: round % slots == slot.
          uint64_t r = next_round;
          if (r % slots != cursor) continue;
          s.round = r;
          s.busy = true;
          ++next_round;
        }
        s.sent_tsc = now;
        for (uint16_t rank = 0; rank < world; ++rank)
          if (rte_mbuf* m = make(rank, cursor, s.round)) tx[ntx++] = m;
      }
    } else {
      while (ntx < 64)
        if (rte_mbuf* m = make(0, 0, 0))
          tx[ntx++] = m;
        else
          break;
    }
    flush();
  }
  const double secs = (double)(rte_get_tsc_cycles() - t0) / hz;
  std::printf("sent=%lu received=%lu seconds=%.3f tx_pps=%.0f rx_pps=%.0f rounds=%lu resent=%lu frame=%u\n",
              (unsigned long)sent, (unsigned long)received, secs, sent / secs, received / secs,
              (unsigned long)rounds_done, (unsigned long)resent, len + RTE_ETHER_CRC_LEN);
  rte_eth_dev_stop(port);
  rte_eth_dev_close(port);
  rte_eal_cleanup();
  return 0;
}
