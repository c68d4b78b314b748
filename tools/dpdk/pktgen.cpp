// gs_dpdk_pktgen: the open-loop frame generator of bench/dpdk_bench.py (one port, one lcore).
//
//   gs_dpdk_pktgen EAL-ARGS -- --mode fwd|agg --size FRAME --seconds T --dst-mac MAC --src-ip A
//        --dst-ip B [--rate PPS] [--dst-port P] [--data-port P] [--threads X] [--job-id J --key K
//        --world W --slots S --seq-base N]
//
// Both modes send FRAME-byte IPv4/UDP frames (FRAME counts the 4-byte CRC: 64..1518, 9000) at
// --rate frames/s (0: as fast as the port takes them), paced by the TSC, and never read anything:
// the switch's results go elsewhere, so the generator's core only sends.
//   fwd: to --dst-mac/--dst-ip:--dst-port (another host): the switch only forwards them.
//   agg: gradswitch DATA packets of all W ranks of job J (float32, as many elements as FRAME
//        allows) to --dst-ip (the aggregation address): round r is slot r % S, seq N + r, its W
//        packets back to back, sent to data port P + slot % X. Every round completes at the switch
//        as long as nothing is lost; its result goes to the job's endpoints.
// Prints one line: "sent=N seconds=T tx_pps=R frame=F rounds=R skipped=S" (S: frames of the
// schedule it could not send in time, not sent at all).
#include <arpa/inet.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"

namespace {

constexpr unsigned kL2L4 = sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr);
constexpr unsigned kBurst = 32;
constexpr uint64_t kMaxBacklog = 256;  // frames a late generator still sends to catch up

struct Options {
  std::string mode = "fwd";
  unsigned size = 64, world = 2, slots = 256, threads = 1;
  double seconds = 3, rate = 0;
  rte_ether_addr dst_mac{};
  uint32_t src_ip = 0, dst_ip = 0, job_id = 0, key = 0, seq_base = 0;
  uint16_t data_port = 7701, dst_port = 9002;
};

bool parse(int argc, char** argv, Options* o) {
  bool have_mac = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help") return false;
    if (i + 1 >= argc) return std::fprintf(stderr, "pktgen: %s needs a value\n", k.c_str()), false;
    const char* v = argv[i + 1];
    bool ok = true;
    if (k == "--mode")
      o->mode = v, ok = o->mode == "fwd" || o->mode == "agg";
    else if (k == "--size")
      o->size = std::atoi(v);
    else if (k == "--seconds")
      o->seconds = std::atof(v);
    else if (k == "--rate")
      o->rate = std::atof(v);
    else if (k == "--dst-mac")
      ok = have_mac = rte_ether_unformat_addr(v, &o->dst_mac) == 0;
    else if (k == "--src-ip")
      ok = inet_pton(AF_INET, v, &o->src_ip) == 1;
    else if (k == "--dst-ip")
      ok = inet_pton(AF_INET, v, &o->dst_ip) == 1;
    else if (k == "--dst-port")
      o->dst_port = std::atoi(v);
    else if (k == "--data-port")
      o->data_port = std::atoi(v);
    else if (k == "--threads")
      o->threads = std::atoi(v);
    else if (k == "--job-id")
      o->job_id = std::strtoul(v, nullptr, 0);
    else if (k == "--key")
      o->key = std::strtoul(v, nullptr, 0);
    else if (k == "--world")
      o->world = std::atoi(v);
    else if (k == "--slots")
      o->slots = std::atoi(v);
    else if (k == "--seq-base")
      o->seq_base = std::strtoul(v, nullptr, 0);
    else
      ok = false;
    if (!ok) return std::fprintf(stderr, "pktgen: bad option %s %s\n", k.c_str(), v), false;
  }
  if (!have_mac || !o->dst_ip || o->size < 64 || o->threads == 0 || o->slots == 0 || o->world == 0 ||
      o->world > 64 || o->seconds <= 0 || o->rate < 0)
    return std::fprintf(stderr, "pktgen: needs --dst-mac, --dst-ip, --size >= 64 and sane counts\n"), false;
  return true;
}

// The frame every packet starts from: Ethernet, IPv4 and UDP headers, payload of ones.
std::vector<uint8_t> template_frame(const Options& o, const rte_ether_addr& src_mac, unsigned len) {
  std::vector<uint8_t> f(len, 0);
  auto* eth = reinterpret_cast<rte_ether_hdr*>(f.data());
  eth->dst_addr = o.dst_mac;
  eth->src_addr = src_mac;
  eth->ether_type = htons(RTE_ETHER_TYPE_IPV4);
  auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
  ip->version_ihl = RTE_IPV4_VHL_DEF;
  ip->total_length = htons(len - sizeof(rte_ether_hdr));
  ip->time_to_live = 64;
  ip->next_proto_id = IPPROTO_UDP;
  ip->src_addr = o.src_ip;
  ip->dst_addr = o.dst_ip;
  ip->hdr_checksum = rte_ipv4_cksum(ip);
  auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
  udp->src_port = htons(9000);
  udp->dst_port = htons(o.mode == "agg" ? o.data_port : o.dst_port);
  udp->dgram_len = htons(len - sizeof(rte_ether_hdr) - sizeof(rte_ipv4_hdr));
  float one = 1.0f;
  for (unsigned off = kL2L4; off + 4 <= len; off += 4) std::memcpy(f.data() + off, &one, 4);
  // Forwarded frames carry a real UDP checksum, which the receiving host verifies, as it does the
  // switch's results. (DATA packets go without one, as allowed over IPv4: their headers vary.)
  if (o.mode == "fwd") udp->dgram_cksum = rte_ipv4_udptcp_cksum(ip, udp);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const int used = rte_eal_init(argc, argv);
  if (used < 0) return std::fprintf(stderr, "pktgen: EAL init failed: %s\n", rte_strerror(rte_errno)), 1;
  Options o;
  if (!parse(argc - used, argv + used, &o)) {
    std::fprintf(stderr,
                 "usage: gs_dpdk_pktgen EAL-ARGS -- --mode fwd|agg --size FRAME --seconds T --dst-mac MAC "
                 "--src-ip A --dst-ip B [--rate PPS] [agg: --job-id J --key K --world W ...]\n");
    return 2;
  }
  const unsigned frame = o.size - RTE_ETHER_CRC_LEN;
  unsigned count = 0, len = frame;
  if (o.mode == "agg") {
    if (frame < kL2L4 + GS_HEADER_BYTES + 4)
      return std::fprintf(stderr, "pktgen: %u-byte frames cannot carry gradswitch data\n", o.size), 1;
    count = (frame - kL2L4 - GS_HEADER_BYTES) / 4;
    len = kL2L4 + GS_HEADER_BYTES + count * 4;
  }
  const unsigned room = len + RTE_PKTMBUF_HEADROOM <= RTE_MBUF_DEFAULT_BUF_SIZE
                            ? RTE_MBUF_DEFAULT_BUF_SIZE
                            : 16384 + RTE_PKTMBUF_HEADROOM;
  rte_mempool* pool = rte_pktmbuf_pool_create("gen", 16383, 256, 0, room, rte_socket_id());
  if (!pool) return std::fprintf(stderr, "pktgen: mempool: %s\n", rte_strerror(rte_errno)), 1;
  const uint16_t port = 0;
  rte_eth_conf conf{};
  if (rte_eth_dev_configure(port, 1, 1, &conf) || rte_eth_rx_queue_setup(port, 0, 1024, 0, nullptr, pool) ||
      rte_eth_tx_queue_setup(port, 0, 1024, 0, nullptr) || rte_eth_dev_start(port))
    return std::fprintf(stderr, "pktgen: port setup failed\n"), 1;
  rte_ether_addr src_mac;
  rte_eth_macaddr_get(port, &src_mac);
  const std::vector<uint8_t> tpl = template_frame(o, src_mac, len);

  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t t0 = rte_get_tsc_cycles(), end = t0 + uint64_t(o.seconds * hz);
  const double cycles_per_frame = o.rate > 0 ? hz / o.rate : 0;
  uint64_t sent = 0, built = 0;
  rte_mbuf* tx[kBurst];
  uint64_t now;
  uint64_t skipped = 0;  // frames of the schedule never sent (the generator lost its CPU)
  while ((now = rte_get_tsc_cycles()) < end) {
    // Open loop at --rate: the frames due by now, in bursts. A generator that lost its CPU for long
    // (a shared machine) does not send its whole backlog at once, which would measure how the switch
    // absorbs a burst rather than the rate: beyond kMaxBacklog frames it skips ahead. Well ahead of
    // the schedule it sleeps, so that it keeps a sleeper's claim on its CPU instead of competing as
    // a spinning task.
    uint64_t due = built + kBurst;
    if (o.rate > 0) {
      due = uint64_t((now - t0) / cycles_per_frame) + 1 - skipped;
      if (due > built + kMaxBacklog) skipped += due - built - kMaxBacklog, due = built + kMaxBacklog;
      if (due <= built) {
        const uint64_t ahead_us = uint64_t((built + 1 - due) * cycles_per_frame * 1e6 / hz);
        if (ahead_us > 20) usleep(std::min<uint64_t>(50, ahead_us / 2));
        continue;
      }
    }
    unsigned n = 0;
    for (; n < kBurst && built < due; ++n, ++built) {
      rte_mbuf* m = rte_pktmbuf_alloc(pool);
      if (!m) break;
      uint8_t* d = rte_pktmbuf_mtod(m, uint8_t*);
      std::memcpy(d, tpl.data(), len);
      m->data_len = m->pkt_len = len;
      if (o.mode == "agg") {
        const uint64_t r = built / o.world;
        const uint16_t slot = static_cast<uint16_t>(r % o.slots);
        const uint16_t rank = static_cast<uint16_t>(built % o.world);
        auto* udp = reinterpret_cast<rte_udp_hdr*>(d + sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr));
        udp->dst_port = htons(o.data_port + slot % o.threads);
        // The switch counts DATA only from the address its rank joined from: --src-ip, port 9000 + rank.
        udp->src_port = htons(9000 + rank);
        gradswitch::HeaderBuilder(GS_MSG_DATA, o.job_id, o.key)
            .rank(rank)
            .slot(slot)
            .flags((r / o.slots) & GS_FLAG_VERSION)
            .elems(GS_ELEM_FLOAT32, static_cast<uint16_t>(count))
            .round(static_cast<uint32_t>(o.seq_base + r), 0)
            .encode(d + kL2L4);
      }
      tx[n] = m;
    }
    unsigned done = 0;
    while (done < n) {
      const uint16_t k = rte_eth_tx_burst(port, 0, tx + done, n - done);
      if (k == 0) break;
      done += k;
    }
    sent += done;
    if (done < n) {  // the port is full: these frames were never sent (and are not counted)
      rte_pktmbuf_free_bulk(tx + done, n - done);
      built -= n - done;
    }
  }
  const double secs = double(rte_get_tsc_cycles() - t0) / hz;
  std::printf("sent=%lu seconds=%.3f tx_pps=%.0f frame=%u rounds=%lu skipped=%lu\n", (unsigned long)sent,
              secs, sent / secs, len + RTE_ETHER_CRC_LEN,
              (unsigned long)(o.mode == "agg" ? sent / o.world : 0), (unsigned long)skipped);
  rte_eth_dev_stop(port);
  rte_eth_dev_close(port);
  rte_eal_cleanup();
  return 0;
}
