// The DPDK backend's switch object, shared by its two halves: dpdk_backend.cpp (set-up, lcores,
// counters, completion signals, stop) and burst_loop.cpp (the packet path). Internal to io/dpdk.
//
// Shared state touched on the packet path: the MAC and neighbour tables (lock-free, l2_tables.h);
// everything else is per lcore (Lcore) or per aggregation thread (AggThread), cache-aligned.
#pragma once

#include <rte_mbuf.h>
#include <rte_ring.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/counter.h"
#include "common/rng.h"
#include "switch/config.h"
#include "switch/engine/engine.h"
#include "switch/io/backend.h"
#include "switch/io/dpdk/completion.h"
#include "switch/io/dpdk/frames.h"
#include "switch/io/dpdk/l2_tables.h"
#include "switch/io/dpdk/ports.h"

namespace gradswitch::dpdk {

inline constexpr unsigned kBurst = 32;
inline constexpr unsigned kMaxPorts = 32;
inline constexpr unsigned kMaxAgg = 64;

// Counters of one lcore (one writer; the stats reader sums them over lcores).
#define GS_DPDK_COUNTERS(X)                                                                         \
  X(rx_frames, "Frames received on all ports")                                                      \
  X(rx_bytes, "Bytes of the frames received on all ports")                                          \
  X(tx_frames, "Frames transmitted on all ports")                                                   \
  X(tx_bytes, "Bytes of the frames transmitted on all ports")                                       \
  X(l2_forwarded, "Frames switched to the one port their destination MAC was learned on")           \
  X(l2_flooded, "Frames flooded to every other port (broadcast, multicast, unknown unicast)")       \
  X(l2_filtered, "Frames dropped because their destination is on the port they came from")          \
  X(agg_in, "Data packets handed to the aggregation threads")                                       \
  X(agg_results, "Results (and ABORT answers) the engine produced")                                 \
  X(agg_frames_out, "Result frames built, one per receiving worker")                                \
  X(arp_replies, "ARP requests for the aggregation address answered by the switch")                 \
  X(arp_requests, "ARP requests sent for a worker or notify address with an unknown MAC")           \
  X(notify_sent, "Completion signals sent (--notify)")                                              \
  X(drop_runt, "Frames dropped: shorter than an Ethernet header, or chained mbufs")                 \
  X(drop_bad_ipv4, "UDP to the aggregation address dropped: bad IPv4 version, IHL or total length") \
  X(drop_bad_udp, "Data packets dropped: UDP length beyond the IPv4 payload")                       \
  X(drop_ip_fragment, "UDP to the aggregation address dropped: IPv4 fragments")                     \
  X(drop_agg_ring_full, "Data packets dropped: the aggregation thread's ring was full")             \
  X(drop_tx_ring_full, "Frames dropped: a port's TX ring was full")                                 \
  X(drop_tx_full, "Frames dropped: the port did not take them (TX queue full)")                     \
  X(drop_no_mbuf, "Frames not built or copied: the mbuf pool was empty")                            \
  X(drop_no_neighbour, "Results or signals not sent: the destination's MAC is not known yet")       \
  X(drop_injected, "Data packets dropped by --drop-rate before the engine")                         \
  X(drop_too_big, "Results not sent: the frame does not fit an mbuf")

struct alignas(64) LcoreCounters {
#define GS_X(name, help) std::atomic<uint64_t> name{0};
  GS_DPDK_COUNTERS(GS_X)
#undef GS_X
  // What the switch costs: TSC cycles of the loop iterations that handled at least one frame, how
  // many such iterations there were and the frames they handled (received, or taken from a ring);
  // the rest of the time the lcore polls empty queues. An iteration longer than
  // kPreemptedIterationNs was interrupted by the scheduler (a shared machine): its cycles are not
  // the switch's, so it is counted apart, with its frames.
  std::atomic<uint64_t> busy_cycles{0}, busy_iterations{0}, busy_frames{0};
  std::atomic<uint64_t> preempted_iterations{0}, preempted_frames{0};
};
inline constexpr uint64_t kPreemptedIterationNs = 500'000;

inline void bump(std::atomic<uint64_t>& c, uint64_t by = 1) {
  counter_add(c, by);
}

struct TxBuffer {
  uint16_t n = 0;
  rte_mbuf* m[kBurst * 4];
};

struct alignas(64) Lcore {
  unsigned lcore_id = 0;
  std::vector<unsigned> rx_ports, tx_ports, aggs;
  bool owns_tx[kMaxPorts] = {};
  bool owns_agg[kMaxAgg] = {};
  TxBuffer tx[kMaxPorts];
  LcoreCounters c;
  uint64_t last_arp_ns = 0;
  uint64_t now_ns = 0;
  uint32_t now_s = 0;
  // Data packets for aggregation threads on this lcore, gathered during an RX burst.
  uint16_t inline_n[kMaxAgg] = {};
  rte_mbuf* inline_m[kMaxAgg][kBurst];
};

struct alignas(64) AggThread {
  rte_ring* ring = nullptr;  // from rx tasks on other lcores
  LossInjector loss;         // --drop-rate
  uint16_t ip_id = 0;
  CompletionRecords completion;
};

// Port counters as the main lcore last read them (ethdev calls stay on the lcores).
struct PortSnapshot {
  std::atomic<uint64_t> ipackets{0}, opackets{0}, ibytes{0}, obytes{0}, imissed{0}, ierrors{0}, oerrors{0},
      rx_nombuf{0};
};

class DpdkSwitch final : public Backend {
 public:
  DpdkSwitch(Engine& engine, const SwitchConfig& config);
  ~DpdkSwitch() override;

  bool init(std::string* error);  // ports, tables, rings, lcores (EAL is up)
  const char* name() const override { return "dpdk"; }
  std::string describe() const override { return describe_; }
  int run(const std::atomic<bool>& stop) override;
  std::vector<BackendStat> stats() const override;

 private:
  // ---- set-up and housekeeping (dpdk_backend.cpp) ----
  bool resolve_addresses(std::string* error);
  bool place_lcores(std::string* error);
  void build_description();
  static int lcore_entry(void* arg);
  void housekeeping(Lcore& lc);  // main lcore: completion signals, port snapshots, stats file
  void snapshot_ports();
  void write_stats_file();

  // ---- the packet path (burst_loop.cpp) ----
  void loop(Lcore& lc);
  unsigned receive(Lcore& lc);
  void handle_frames(Lcore& lc, unsigned port, rte_mbuf** frames, uint16_t n);
  void to_aggregation(Lcore& lc, unsigned agg, rte_mbuf* m);
  unsigned drain_aggregation(Lcore& lc);
  void aggregate(Lcore& lc, unsigned agg, rte_mbuf** packets, unsigned n);
  void send_result(Lcore& lc, unsigned agg, const IngestResult& r);
  bool send_udp(Lcore& lc, uint32_t dst_ip_be, uint16_t src_port_be, uint16_t dst_port_be,
                const uint8_t* payload, uint32_t len, uint64_t payload_sum, uint16_t* ip_id);
  void send_arp_request(Lcore& lc, uint32_t target_ip_be);
  void switch_frame(Lcore& lc, unsigned in_port, rte_mbuf* m);
  void flood(Lcore& lc, int in_port, rte_mbuf* m);
  void emit(Lcore& lc, unsigned port, rte_mbuf* m);
  unsigned transmit(Lcore& lc);
  void flush_tx(Lcore& lc, unsigned port);

  Engine& engine_;
  SwitchConfig config_;
  FrameRules rules_;           // agg address and MAC, data ports, ARP answering
  uint32_t notify_ip_be_ = 0;  // --notify; 0 = off
  uint16_t notify_port_be_ = 0;
  uint16_t notify_ip_id_ = 0;
  bool udp_checksum_ = true;
  std::string layout_;  // the one chosen
  std::vector<Port> ports_;
  std::unique_ptr<PortSnapshot[]> port_stats_;
  std::vector<std::unique_ptr<Lcore>> lcores_;  // [0] is the main lcore
  std::unique_ptr<AggThread[]> agg_;
  std::unique_ptr<MacTable> macs_;
  std::unique_ptr<NeighbourTable> neighbours_;
  std::unique_ptr<CompletionMonitor> completion_;             // main lcore only
  std::vector<const CompletionRecords*> completion_records_;  // one per aggregation thread
  std::string describe_;
  const std::atomic<bool>* stop_ = nullptr;
  std::atomic<bool> halt_{false};
  uint64_t next_monitor_ns_ = 0, next_port_snapshot_ns_ = 0, next_stats_ns_ = 0;
  uint64_t preempted_cycles_ = 0;  // kPreemptedIterationNs in TSC cycles
};

}  // namespace gradswitch::dpdk
