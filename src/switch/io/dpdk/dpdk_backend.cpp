// The DPDK backend: an L2 learning switch whose ports are DPDK ethdevs, which intercepts the
// gradswitch data packets addressed to the aggregation address and hands them to the engine.
//
// Thread layout (paper 000, Fig. 8 and 9), built from three kinds of task:
//   rx<p>  receive burst on port p, learn, classify: aggregation traffic -> the ring of agg<k>
//          (k = UDP port - data_port), everything else -> the TX ring of the destination port(s);
//   tx<p>  drain port p's TX ring (multi-producer rte_ring) and transmit in bursts;
//   agg<k> drain its ring, engine.ingest(k, ...) in bursts, build one frame per receiving worker.
// Tasks are placed on the EAL lcores by --layout (docs/dpdk.md). A task that hands work to a task
// on the same lcore skips the ring (it calls the engine or buffers the frame directly).
//
// Shared state touched on the packet path: the MAC table (learned port per MAC) and the neighbour
// table (MAC per IPv4 address), both lock-free open-addressed arrays of atomics; everything else
// is per lcore or per aggregation thread, cache-aligned.
#include "switch/io/dpdk/dpdk_backend.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <rte_arp.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_udp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "gradswitch/wire.h"
#include "switch/config.h"
#include "switch/engine/engine.h"

namespace gradswitch {
namespace {

constexpr unsigned kBurst = 32;
constexpr unsigned kMaxPorts = 32;
constexpr unsigned kMaxAgg = 64;
constexpr unsigned kJobEntries = 256;           // engine job ids: low 8 bits are the table index
constexpr uint32_t kNotifyMagic = 0x4753434Eu;  // "GSCN"

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  uint32_t agg_ip_be = 0;
  bool have_agg_mac = false;
  rte_ether_addr agg_mac{};
  unsigned agg_prefix = 24;
  uint16_t data_port = 7701;
  unsigned threads = 1;
  std::string layout = "auto";
  unsigned age_s = 300;
  unsigned idle_sleep_us = 0;
  std::string answer_arp = "auto";  // auto | on | off
  bool configure_tap = true;
  bool udp_checksum = true;
  uint32_t notify_ip_be = 0;
  uint16_t notify_port_be = 0;
  unsigned notify_quiet_us = 1000;
  std::string stats_file;
  unsigned stats_interval_ms = 1000;
  unsigned mbufs = 8191;
  unsigned ring_size = 4096;
  unsigned rx_desc = 1024, tx_desc = 1024;
  double drop_rate = 0;
  uint64_t seed = 1;
  unsigned mtu = 1500;
};

bool parse_ipv4(const std::string& s, uint32_t* be) {
  in_addr a;
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) return false;
  *be = a.s_addr;
  return true;
}

std::string ip_str(uint32_t be) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{be};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

std::string mac_str(const rte_ether_addr& m) {
  char buf[RTE_ETHER_ADDR_FMT_SIZE];
  rte_ether_format_addr(buf, sizeof buf, &m);
  return buf;
}

bool parse_unsigned(const std::string& s, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 19) return false;
  uint64_t v = std::strtoull(s.c_str(), nullptr, 10);
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Lock-free tables

inline uint64_t mac_key(const rte_ether_addr& m) {
  uint64_t k = 0;
  std::memcpy(&k, m.addr_bytes, 6);
  return k;  // 48 bits, never 0 for a learnable (unicast, non-zero) address
}

inline uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// MAC -> port. One 64-bit word per entry: MAC in the low 48 bits, port + 1 in the high 16, so an
// entry is read and written atomically; `seen_s` ages it. Entries are never removed: an aged one
// reads as missing and is reused by the next new address that probes it.
class MacTable {
 public:
  static constexpr unsigned kSize = 4096, kProbe = 16;
  int lookup(const rte_ether_addr& m, uint32_t now_s, uint32_t age_s) const {
    const uint64_t key = mac_key(m);
    for (unsigned i = 0, h = mix(key); i < kProbe; ++i, ++h) {
      const Entry& e = e_[h % kSize];
      const uint64_t w = e.word.load(std::memory_order_relaxed);
      if (w == 0) return -1;
      if ((w & kMacMask) == key) {
        if (now_s - e.seen_s.load(std::memory_order_relaxed) > age_s) continue;
        return static_cast<int>(w >> 48) - 1;
      }
    }
    return -1;
  }
  // Returns true when the address was new or moved (for counters).
  bool learn(const rte_ether_addr& m, unsigned port, uint32_t now_s, uint32_t age_s) {
    const uint64_t key = mac_key(m);
    const uint64_t word = key | (uint64_t{port + 1} << 48);
    Entry* reuse = nullptr;
    for (unsigned i = 0, h = mix(key); i < kProbe; ++i, ++h) {
      Entry& e = e_[h % kSize];
      uint64_t w = e.word.load(std::memory_order_relaxed);
      if ((w & kMacMask) == key) {
        bool changed = w != word;
        if (changed) e.word.store(word, std::memory_order_relaxed);
        if (changed || e.seen_s.load(std::memory_order_relaxed) != now_s)
          e.seen_s.store(now_s, std::memory_order_relaxed);
        return changed;
      }
      if (w == 0) {
        if (reuse) break;
        e.seen_s.store(now_s, std::memory_order_relaxed);
        if (e.word.compare_exchange_strong(w, word, std::memory_order_release)) return true;
        if ((w & kMacMask) == key) return false;  // another lcore learned it just now
        continue;
      }
      if (!reuse && now_s - e.seen_s.load(std::memory_order_relaxed) > age_s) reuse = &e;
    }
    if (reuse) {
      reuse->seen_s.store(now_s, std::memory_order_relaxed);
      reuse->word.store(word, std::memory_order_relaxed);
      return true;
    }
    return false;  // table region full: the address stays unknown (flooded)
  }
  unsigned live(uint32_t now_s, uint32_t age_s) const {
    unsigned n = 0;
    for (const Entry& e : e_)
      if (e.word.load(std::memory_order_relaxed) && now_s - e.seen_s.load(std::memory_order_relaxed) <= age_s)
        ++n;
    return n;
  }
  void dump(std::string* out, uint32_t now_s, uint32_t age_s) const {
    for (const Entry& e : e_) {
      uint64_t w = e.word.load(std::memory_order_relaxed);
      if (!w || now_s - e.seen_s.load(std::memory_order_relaxed) > age_s) continue;
      rte_ether_addr m;
      std::memcpy(m.addr_bytes, &w, 6);
      *out += "mac." + mac_str(m) + "=" + std::to_string((w >> 48) - 1) + "\n";
    }
  }

 private:
  static constexpr uint64_t kMacMask = (uint64_t{1} << 48) - 1;
  struct Entry {
    std::atomic<uint64_t> word{0};
    std::atomic<uint32_t> seen_s{0};
  };
  Entry e_[kSize];
};

// IPv4 -> MAC (the neighbour table), learned from ARP senders and IPv4 sources. An entry's key is
// claimed once (CAS from 0) and keeps its address; the MAC word carries a valid bit.
class NeighTable {
 public:
  static constexpr unsigned kSize = 4096, kProbe = 16;
  bool lookup(uint32_t ip_be, rte_ether_addr* m, uint32_t now_s, uint32_t age_s) const {
    for (unsigned i = 0, h = mix(ip_be); i < kProbe; ++i, ++h) {
      const Entry& e = e_[h % kSize];
      uint32_t k = e.ip.load(std::memory_order_acquire);
      if (k == 0) return false;
      if (k != ip_be) continue;
      uint64_t w = e.mac.load(std::memory_order_relaxed);
      if (!(w >> 63) || now_s - e.seen_s.load(std::memory_order_relaxed) > age_s) return false;
      std::memcpy(m->addr_bytes, &w, 6);
      return true;
    }
    return false;
  }
  void learn(uint32_t ip_be, const rte_ether_addr& m, uint32_t now_s) {
    if (ip_be == 0 || ip_be == 0xFFFFFFFFu || rte_is_multicast_ether_addr(&m) || rte_is_zero_ether_addr(&m))
      return;
    const uint64_t word = mac_key(m) | (uint64_t{1} << 63);
    for (unsigned i = 0, h = mix(ip_be); i < kProbe; ++i, ++h) {
      Entry& e = e_[h % kSize];
      uint32_t k = e.ip.load(std::memory_order_acquire);
      if (k == 0) {
        if (!e.ip.compare_exchange_strong(k, ip_be, std::memory_order_acq_rel) && k != ip_be) continue;
      } else if (k != ip_be) {
        continue;
      }
      if (e.mac.load(std::memory_order_relaxed) != word) e.mac.store(word, std::memory_order_relaxed);
      if (e.seen_s.load(std::memory_order_relaxed) != now_s) e.seen_s.store(now_s, std::memory_order_relaxed);
      return;
    }
  }
  void dump(std::string* out, uint32_t now_s, uint32_t age_s) const {
    for (const Entry& e : e_) {
      uint32_t k = e.ip.load(std::memory_order_relaxed);
      uint64_t w = e.mac.load(std::memory_order_relaxed);
      if (!k || !(w >> 63) || now_s - e.seen_s.load(std::memory_order_relaxed) > age_s) continue;
      rte_ether_addr m;
      std::memcpy(m.addr_bytes, &w, 6);
      *out += "neigh." + ip_str(k) + "=" + mac_str(m) + "\n";
    }
  }

 private:
  struct Entry {
    std::atomic<uint32_t> ip{0};
    std::atomic<uint32_t> seen_s{0};
    std::atomic<uint64_t> mac{0};
  };
  Entry e_[kSize];
};

// ---------------------------------------------------------------------------------------------
// Per-lcore counters (one writer, read by the stats writer)

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
  X(drop_ip_fragment, "Data packets dropped: IPv4 fragments")                                       \
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
  // Cost of the switch: TSC cycles of the loop iterations that handled at least one frame, and
  // how many such iterations there were (the rest of the time the lcore polls empty queues).
  std::atomic<uint64_t> busy_cycles{0}, busy_iterations{0};
};

// Port counters as the main lcore last read them (ethdev calls stay on the lcores).
struct PortSnapshot {
  std::atomic<uint64_t> ipackets{0}, opackets{0}, ibytes{0}, obytes{0}, imissed{0}, ierrors{0}, oerrors{0},
      rx_nombuf{0};
};

inline void bump(std::atomic<uint64_t>& c, uint64_t by = 1) {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Completion tracking: per aggregation thread, per job, the latest result seq (seqlock-protected).

struct JobProgress {
  std::atomic<uint32_t> lock{0};  // odd while the owner writes
  std::atomic<uint32_t> job_id{0};
  std::atomic<uint32_t> seq{0};
  std::atomic<uint64_t> elems{0};  // result elements multicast for `seq`
  std::atomic<uint64_t> last_ns{0};
};

struct alignas(64) AggState {
  rte_ring* ring = nullptr;
  uint64_t rng = 0;
  uint32_t drop_threshold = 0;  // drop when (rng >> 32) < threshold
  uint16_t ip_id = 0;
  JobProgress progress[kJobEntries];
};

struct Port {
  uint16_t id = 0;
  std::string driver, iface;
  rte_ether_addr mac{};
  bool local = false;  // net_tap: the switch host's own kernel stack sits behind it
  rte_mempool* pool = nullptr;
  rte_ring* tx_ring = nullptr;
  unsigned tx_owner = 0;  // index into lcores_
};

struct TxBuf {
  uint16_t n = 0;
  rte_mbuf* m[kBurst * 4];
};

struct alignas(64) Lcore {
  unsigned lcore_id = 0;
  std::vector<unsigned> rx_ports, tx_ports, aggs;
  bool owns_tx[kMaxPorts] = {};
  bool owns_agg[kMaxAgg] = {};
  TxBuf tx[kMaxPorts];
  LcoreCounters c;
  uint64_t last_arp_ns = 0;
  uint64_t now_ns = 0;
  uint32_t now_s = 0;
  // Aggregation packets for tasks on this lcore, gathered during an RX burst.
  uint16_t inline_n[kMaxAgg] = {};
  rte_mbuf* inline_m[kMaxAgg][kBurst];
};

std::string help_text() {
  return R"(DPDK backend: gradswitchd [daemon options] --backend dpdk -- EAL-ARGS [-- DPDK-OPTIONS]

The switch owns every DPDK port EAL finds (one per attached host) and is an L2 learning switch
between them: ARP, ping, TCP... pass through. IPv4/UDP packets to the aggregation address on
ports data_port .. data_port+threads-1 are summed by the engine (thread k = port - data_port) and
the result is sent to every worker of the job with rewritten Ethernet/IPv4/UDP headers.
A net_tap port gives this process's kernel stack an interface on the switched segment; the
backend assigns it the aggregation address so the TCP control plane answers through the switch.

EAL-ARGS (examples):
  -l 0,1 --no-huge --no-pci --vdev=net_af_xdp0,iface=veth1 --vdev=net_af_xdp1,iface=veth2
         --vdev=net_tap0,iface=gscp0
  production: -l 0-5 -a 0000:3b:00.0 -a 0000:3b:00.1 (PCI NICs bound to vfio-pci)
  Added when missing: --no-shconf (unless --file-prefix/--in-memory), -m 256 with --no-huge.
  net_af_xdp frames are limited to ~3.5 KB: use net_af_packet for 9000-byte MTUs.

Thread layout (P ports, X = --threads aggregation threads, L = EAL lcores):
  8b      paper 000 Fig. 8(b): one lcore per rx<p>, per tx<p>, per agg<k>; L >= 2P+X
  8a      Fig. 8(a): one lcore per port (rx+tx), one per agg<k>;       L >= P+X
  io      all port tasks on the main lcore, agg<k> spread over the others; L >= 2
  single  everything on the main lcore (L = 1 works)
  auto    (default) the first of 8b, 8a, io, single that fits L
Rings: each agg<k> has a lock-free ring fed by the rx tasks; each port has a TX ring fed by rx and
agg tasks; a producer on the same lcore as the consumer bypasses the ring.

DPDK-OPTIONS:
  --agg-ip A.B.C.D      aggregation address (default: the daemon's --control-host if not 0.0.0.0)
  --agg-prefix N        prefix length for the tap interface (default 24)
  --agg-mac MAC         source MAC of results (default: the tap port's MAC, else the first port's)
  --layout L            auto | 8b | 8a | io | single
  --no-tap-config       do not assign the aggregation address to net_tap interfaces
  --answer-arp M        auto | on | off: answer ARP for the aggregation address (auto: when no
                        net_tap port exists; off when it is a host's own address, paper 000 mode)
  --notify IP:PORT      completion signal: a UDP datagram per completed allreduce (docs/dpdk.md)
  --notify-quiet-us N   a job's latest seq counts as complete after N us without results (1000)
  --mac-age S           MAC / neighbour ageing in seconds (default 300)
  --idle-sleep-us N     sleep N us after 64 idle polls (default 0 = pure polling)
  --udp-checksum on|off compute UDP checksums of results (default on)
  --stats-file PATH     rewrite PATH with key=value counters every --stats-interval-ms (1000)
  --mbufs N             mbufs per port pool (default 8191)
  --ring-size N         entries per rte_ring (power of two, default 4096)
Daemon options used: --data-port, --threads, --mtu, --drop-rate/--seed (loss injected on
received data packets), --control-host.
)";
}

// ---------------------------------------------------------------------------------------------

class DpdkBackend final : public Backend {
 public:
  DpdkBackend(Engine& engine, const Options& o) : engine_(engine), o_(o) {}
  ~DpdkBackend() override { shutdown(); }

  bool init(std::string* error);
  const char* name() const override { return "dpdk"; }
  std::string describe() const override { return describe_; }
  int run(const std::atomic<bool>& stop) override;
  std::vector<BackendStat> stats() const override;

 private:
  static int lcore_entry(void* arg);
  void loop(Lcore& lc);
  void handle_rx(Lcore& lc, unsigned port, rte_mbuf** m, uint16_t n);
  void agg_batch(Lcore& lc, unsigned k, rte_mbuf** m, unsigned n);
  void send_result(Lcore& lc, unsigned k, const IngestResult& r, uint16_t sport_be);
  bool send_udp(Lcore& lc, uint32_t dst_ip, uint16_t sport_be, uint16_t dport_be, const uint8_t* data,
                uint32_t len, uint16_t* ip_id, int payload_sum = -1);
  void emit(Lcore& lc, unsigned port, rte_mbuf* m);
  void flood(Lcore& lc, int in_port, rte_mbuf* m);
  void flush_tx(Lcore& lc, unsigned port);
  void arp_request(Lcore& lc, uint32_t target_ip);
  void monitor(Lcore& lc);
  void snapshot_ports();
  void write_stats();
  void shutdown();
  bool assign_layout(std::string* error);
  bool configure_tap(const Port& p, std::string* error);

  Engine& engine_;
  Options o_;
  std::vector<Port> ports_;
  std::unique_ptr<PortSnapshot[]> port_stats_;
  uint64_t next_port_snapshot_ns_ = 0;
  std::vector<std::unique_ptr<Lcore>> lcores_;
  std::unique_ptr<AggState[]> agg_;
  std::unique_ptr<MacTable> macs_;
  std::unique_ptr<NeighTable> neigh_;
  std::string describe_;
  const std::atomic<bool>* stop_ = nullptr;
  std::atomic<bool> halt_{false};
  bool answer_arp_ = false;
  bool started_ = false;
  uint64_t next_stats_ns_ = 0;
  uint64_t next_monitor_ns_ = 0;
  uint16_t notify_ip_id_ = 0;
  // Monitor state (main lcore only).
  struct Signal {
    uint32_t job_id = 0;
    bool any = false;
    uint32_t signaled = 0;  // latest seq signaled
    uint32_t seen = 0;      // latest seq observed
    uint64_t elems = 0;
    uint64_t last_ns = 0;
    bool pending = false;  // `seen` not yet signaled
  };
  std::map<uint32_t, Signal> signals_;
};

bool seq_after(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) > 0;
}

bool DpdkBackend::configure_tap(const Port& p, std::string* error) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return *error = "socket: " + std::string(strerror(errno)), false;
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", p.iface.c_str());
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = o_.agg_ip_be;
  bool ok = ioctl(fd, SIOCSIFADDR, &ifr) == 0;
  if (ok) {
    sin->sin_addr.s_addr = o_.agg_prefix ? htonl(~0u << (32 - o_.agg_prefix)) : 0;
    ok = ioctl(fd, SIOCSIFNETMASK, &ifr) == 0;
  }
  if (ok) ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    ifr.ifr_flags |= IFF_UP;
    ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  }
  if (!ok)
    *error =
        "cannot assign " + ip_str(o_.agg_ip_be) + " to tap interface " + p.iface + ": " + strerror(errno);
  close(fd);
  return ok;
}

bool DpdkBackend::init(std::string* error) {
  const uint16_t nports = rte_eth_dev_count_avail();
  if (nports == 0)
    return *error =
               "DPDK found no ports: pass --vdev=net_af_xdp0,iface=IFACE (one per host) or -a PCI-ADDRESS",
           false;
  if (nports > kMaxPorts) return *error = "too many ports (max " + std::to_string(kMaxPorts) + ")", false;
  if (o_.threads == 0 || o_.threads > kMaxAgg)
    return *error = "threads must be 1.." + std::to_string(kMaxAgg), false;
  port_stats_ = std::make_unique<PortSnapshot[]>(nports);
  macs_ = std::make_unique<MacTable>();
  neigh_ = std::make_unique<NeighTable>();
  agg_ = std::make_unique<AggState[]>(o_.threads);

  const unsigned frame = o_.mtu + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
  // Jumbo frames: af_packet wants the whole ring frame (framesz, e.g. 12288) to fit in an mbuf.
  const unsigned data_room = frame + RTE_PKTMBUF_HEADROOM <= RTE_MBUF_DEFAULT_BUF_SIZE
                                 ? RTE_MBUF_DEFAULT_BUF_SIZE
                                 : std::max<unsigned>(16384, frame) + RTE_PKTMBUF_HEADROOM;
  uint16_t pid;
  RTE_ETH_FOREACH_DEV(pid) {
    Port p;
    p.id = pid;
    rte_eth_dev_info info;
    int r = rte_eth_dev_info_get(pid, &info);
    if (r != 0)
      return *error = "rte_eth_dev_info_get(" + std::to_string(pid) + "): " + rte_strerror(-r), false;
    p.driver = info.driver_name ? info.driver_name : "?";
    char name[IF_NAMESIZE] = {};
    if (info.if_index && if_indextoname(info.if_index, name)) p.iface = name;
    char devname[RTE_ETH_NAME_MAX_LEN] = {};
    rte_eth_dev_get_name_by_port(pid, devname);
    if (p.iface.empty()) p.iface = devname;
    p.local = p.driver == "net_tap";
    // af_xdp really is limited (one page per frame); af_packet reports 1518 but takes what its
    // ring frames (framesz) hold, so only warn for the others.
    if (info.max_rx_pktlen && info.max_rx_pktlen < frame && p.driver != "net_af_xdp")
      GS_LOG_WARN(
          "dpdk: port %u (%s) reports frames up to %u bytes, --mtu %u needs %u: check the vdev's frame size",
          pid, p.driver.c_str(), info.max_rx_pktlen, o_.mtu, frame);
    else if (info.max_rx_pktlen && info.max_rx_pktlen < frame)
      return *error = "port " + std::to_string(pid) + " (" + p.driver + ") takes frames up to " +
                      std::to_string(info.max_rx_pktlen) + " bytes, --mtu " + std::to_string(o_.mtu) +
                      " needs " + std::to_string(frame) +
                      (p.driver == "net_af_xdp" ? ": use net_af_packet for jumbo frames" : ""),
             false;
    std::string pool_name = "gs_pool" + std::to_string(pid);
    p.pool =
        rte_pktmbuf_pool_create(pool_name.c_str(), o_.mbufs, 256, 0, data_room, rte_eth_dev_socket_id(pid));
    if (!p.pool)
      return *error = "mbuf pool for port " + std::to_string(pid) + ": " + rte_strerror(rte_errno) +
                      " (with --no-huge give EAL more memory: -m 512, or fewer --mbufs)",
             false;
    rte_eth_conf conf{};
    conf.rxmode.mtu = o_.mtu;
    r = rte_eth_dev_configure(pid, 1, 1, &conf);
    if (r != 0) {
      conf.rxmode.mtu = 0;  // some virtual PMDs refuse an MTU; frames are sized by the pool then
      r = rte_eth_dev_configure(pid, 1, 1, &conf);
    }
    uint16_t nrx = o_.rx_desc, ntx = o_.tx_desc;
    if (r == 0) r = rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nrx, &ntx);
    if (r == 0) r = rte_eth_rx_queue_setup(pid, 0, nrx, rte_eth_dev_socket_id(pid), nullptr, p.pool);
    if (r == 0) r = rte_eth_tx_queue_setup(pid, 0, ntx, rte_eth_dev_socket_id(pid), nullptr);
    if (r == 0) r = rte_eth_dev_start(pid);
    if (r != 0)
      return *error = "port " + std::to_string(pid) + " (" + p.driver + " " + p.iface +
                      "): setup failed: " + rte_strerror(-r),
             false;
    started_ = true;
    rte_eth_promiscuous_enable(pid);  // a switch port takes every frame (a no-op for some vdevs)
    rte_eth_macaddr_get(pid, &p.mac);
    if (p.local) {
      // The kernel side of the tap has its own MAC; it is the one that answers ARP.
      int fd = socket(AF_INET, SOCK_DGRAM, 0);
      ifreq ifr{};
      std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", p.iface.c_str());
      if (fd >= 0 && ioctl(fd, SIOCGIFHWADDR, &ifr) == 0)
        std::memcpy(p.mac.addr_bytes, ifr.ifr_hwaddr.sa_data, 6);
      if (fd >= 0) close(fd);
    }
    std::string ring_name = "gs_tx" + std::to_string(pid);
    p.tx_ring = rte_ring_create(ring_name.c_str(), o_.ring_size, rte_eth_dev_socket_id(pid), RING_F_SC_DEQ);
    if (!p.tx_ring) return *error = "tx ring: " + std::string(rte_strerror(rte_errno)), false;
    ports_.push_back(p);
  }
  bool have_local = false;
  for (const Port& p : ports_) {
    if (!p.local) continue;
    if (!have_local && !o_.have_agg_mac) o_.agg_mac = p.mac, o_.have_agg_mac = true;
    have_local = true;
    if (o_.configure_tap && !configure_tap(p, error)) return false;
  }
  if (!o_.have_agg_mac) {
    o_.agg_mac = ports_[0].mac;
    o_.agg_mac.addr_bytes[0] = (o_.agg_mac.addr_bytes[0] | 0x02) & ~0x01;  // locally administered
  }
  answer_arp_ = o_.answer_arp == "on" || (o_.answer_arp == "auto" && !have_local);
  for (unsigned k = 0; k < o_.threads; ++k) {
    std::string name = "gs_agg" + std::to_string(k);
    agg_[k].ring = rte_ring_create(name.c_str(), o_.ring_size, rte_socket_id(), RING_F_SC_DEQ);
    if (!agg_[k].ring) return *error = "agg ring: " + std::string(rte_strerror(rte_errno)), false;
    agg_[k].rng = (o_.seed + 0x9E3779B97F4A7C15ull * (k + 1)) | 1;
    agg_[k].drop_threshold = static_cast<uint32_t>(std::min(1.0, std::max(0.0, o_.drop_rate)) * 4294967295.0);
  }
  if (!assign_layout(error)) return false;

  std::ostringstream d;
  d << "dpdk: " << ports_.size() << " ports [";
  for (const Port& p : ports_)
    d << (p.id ? " " : "") << p.id << "=" << p.driver << ":" << p.iface << (p.local ? "(local)" : "");
  d << "], agg " << ip_str(o_.agg_ip_be) << " udp " << o_.data_port << ".." << o_.data_port + o_.threads - 1
    << " mac " << mac_str(o_.agg_mac) << ", layout " << o_.layout << ":";
  for (const auto& lc : lcores_) {
    d << " lcore" << lc->lcore_id << "=[";
    std::string sep;
    for (unsigned p : lc->rx_ports) d << sep << "rx" << p, sep = " ";
    for (unsigned p : lc->tx_ports) d << sep << "tx" << p, sep = " ";
    for (unsigned k : lc->aggs) d << sep << "agg" << k, sep = " ";
    d << "]";
  }
  if (answer_arp_) d << ", answers ARP";
  if (o_.notify_ip_be) d << ", notify " << ip_str(o_.notify_ip_be) << ":" << ntohs(o_.notify_port_be);
  describe_ = d.str();
  return true;
}

bool DpdkBackend::assign_layout(std::string* error) {
  std::vector<unsigned> ids{rte_get_main_lcore()};
  unsigned id;
  RTE_LCORE_FOREACH_WORKER(id) ids.push_back(id);
  const unsigned L = ids.size(), P = ports_.size(), X = o_.threads;
  std::string layout = o_.layout;
  if (layout == "auto") layout = L >= 2 * P + X ? "8b" : L >= P + X ? "8a" : L >= 2 ? "io" : "single";
  const unsigned need = layout == "8b" ? 2 * P + X : layout == "8a" ? P + X : layout == "io" ? 2 : 1;
  if (L < need)
    return *error = "layout " + layout + " needs " + std::to_string(need) + " lcores, EAL has " +
                    std::to_string(L) + " (EAL -l)",
           false;
  o_.layout = layout;
  // Only lcores that get a task are used; the main lcore always runs (it also does the stats).
  for (unsigned i = 0; i < L; ++i) {
    auto lc = std::make_unique<Lcore>();
    lc->lcore_id = ids[i];
    lcores_.push_back(std::move(lc));
  }
  auto give_rx = [&](unsigned li, unsigned p) { lcores_[li]->rx_ports.push_back(p); };
  auto give_tx = [&](unsigned li, unsigned p) {
    lcores_[li]->tx_ports.push_back(p);
    lcores_[li]->owns_tx[p] = true;
    ports_[p].tx_owner = li;
  };
  auto give_agg = [&](unsigned li, unsigned k) {
    lcores_[li]->aggs.push_back(k);
    lcores_[li]->owns_agg[k] = true;
  };
  unsigned next = 0;
  if (layout == "8b") {
    for (unsigned p = 0; p < P; ++p) give_rx(next++, p);
    for (unsigned p = 0; p < P; ++p) give_tx(next++, p);
    for (unsigned k = 0; k < X; ++k) give_agg(next++, k);
  } else if (layout == "8a") {
    for (unsigned p = 0; p < P; ++p) give_rx(next, p), give_tx(next++, p);
    for (unsigned k = 0; k < X; ++k) give_agg(next++, k);
  } else if (layout == "io") {
    for (unsigned p = 0; p < P; ++p) give_rx(0, p), give_tx(0, p);
    for (unsigned k = 0; k < X; ++k) give_agg(1 + k % (L - 1), k);
  } else {
    for (unsigned p = 0; p < P; ++p) give_rx(0, p), give_tx(0, p);
    for (unsigned k = 0; k < X; ++k) give_agg(0, k);
  }
  // Drop lcores without work (but keep the main lcore).
  std::vector<std::unique_ptr<Lcore>> used;
  for (unsigned i = 0; i < lcores_.size(); ++i) {
    Lcore& lc = *lcores_[i];
    if (i == 0 || !lc.rx_ports.empty() || !lc.tx_ports.empty() || !lc.aggs.empty())
      used.push_back(std::move(lcores_[i]));
  }
  lcores_ = std::move(used);
  for (unsigned i = 0; i < lcores_.size(); ++i)
    for (unsigned p : lcores_[i]->tx_ports) ports_[p].tx_owner = i;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Packet path

inline void refresh_clock(Lcore& lc) {
  lc.now_ns = monotonic_ns();
  lc.now_s = static_cast<uint32_t>(lc.now_ns / 1000000000ull);
}

void DpdkBackend::flush_tx(Lcore& lc, unsigned port) {
  TxBuf& b = lc.tx[port];
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

void DpdkBackend::emit(Lcore& lc, unsigned port, rte_mbuf* m) {
  if (lc.owns_tx[port]) {
    TxBuf& b = lc.tx[port];
    b.m[b.n++] = m;
    if (b.n == kBurst) flush_tx(lc, port);
    return;
  }
  if (rte_ring_mp_enqueue(ports_[port].tx_ring, m) != 0) {
    bump(lc.c.drop_tx_ring_full);
    rte_pktmbuf_free(m);
  }
}

void DpdkBackend::flood(Lcore& lc, int in_port, rte_mbuf* m) {
  int last = -1;
  for (unsigned q = 0; q < ports_.size(); ++q)
    if (static_cast<int>(q) != in_port) last = q;
  if (last < 0) return (void)rte_pktmbuf_free(m);
  for (unsigned q = 0; q < ports_.size(); ++q) {
    if (static_cast<int>(q) == in_port || static_cast<int>(q) == last) continue;
    rte_mbuf* c = rte_pktmbuf_copy(m, ports_[q].pool, 0, UINT32_MAX);
    if (!c) {
      bump(lc.c.drop_no_mbuf);
      continue;
    }
    emit(lc, q, c);
  }
  emit(lc, last, m);
}

void DpdkBackend::arp_request(Lcore& lc, uint32_t target_ip) {
  if (lc.now_ns - lc.last_arp_ns < 10'000'000ull) return;  // at most one per 10 ms per lcore
  lc.last_arp_ns = lc.now_ns;
  rte_mbuf* m = rte_pktmbuf_alloc(ports_[0].pool);
  if (!m) return bump(lc.c.drop_no_mbuf);
  auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
  auto* arp = reinterpret_cast<rte_arp_hdr*>(eth + 1);
  std::memset(eth->dst_addr.addr_bytes, 0xFF, 6);
  eth->src_addr = o_.agg_mac;
  eth->ether_type = htons(RTE_ETHER_TYPE_ARP);
  arp->arp_hardware = htons(RTE_ARP_HRD_ETHER);
  arp->arp_protocol = htons(RTE_ETHER_TYPE_IPV4);
  arp->arp_hlen = 6;
  arp->arp_plen = 4;
  arp->arp_opcode = htons(RTE_ARP_OP_REQUEST);
  arp->arp_data.arp_sha = o_.agg_mac;
  arp->arp_data.arp_sip = o_.agg_ip_be;
  std::memset(&arp->arp_data.arp_tha, 0, 6);
  arp->arp_data.arp_tip = target_ip;
  m->data_len = m->pkt_len = 60;
  std::memset(reinterpret_cast<uint8_t*>(arp + 1), 0, 60 - sizeof(*eth) - sizeof(*arp));
  bump(lc.c.arp_requests);
  flood(lc, -1, m);
}

// Builds Ethernet/IPv4/UDP around `data` for `dst_ip` and sends it out of the port behind the
// destination's MAC. Returns false (counted) when the neighbour is unknown or no mbuf is left.
bool DpdkBackend::send_udp(Lcore& lc, uint32_t dst_ip, uint16_t sport_be, uint16_t dport_be,
                           const uint8_t* data, uint32_t len, uint16_t* ip_id, int payload_sum) {
  rte_ether_addr dmac;
  if (!neigh_->lookup(dst_ip, &dmac, lc.now_s, o_.age_s)) {
    bump(lc.c.drop_no_neighbour);
    arp_request(lc, dst_ip);
    return false;
  }
  const int port = macs_->lookup(dmac, lc.now_s, o_.age_s);
  const unsigned pool_port = port >= 0 ? port : 0;
  const uint32_t frame = sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr) + len;
  rte_mbuf* m = rte_pktmbuf_alloc(ports_[pool_port].pool);
  if (!m) return bump(lc.c.drop_no_mbuf), false;
  if (frame > rte_pktmbuf_tailroom(m)) {
    rte_pktmbuf_free(m);
    return bump(lc.c.drop_too_big), false;
  }
  auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
  auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
  auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
  eth->dst_addr = dmac;
  eth->src_addr = o_.agg_mac;
  eth->ether_type = htons(RTE_ETHER_TYPE_IPV4);
  ip->version_ihl = RTE_IPV4_VHL_DEF;
  ip->type_of_service = 0;
  ip->total_length = htons(static_cast<uint16_t>(frame - sizeof(rte_ether_hdr)));
  ip->packet_id = htons((*ip_id)++);
  ip->fragment_offset = htons(RTE_IPV4_HDR_DF_FLAG);
  ip->time_to_live = 64;
  ip->next_proto_id = IPPROTO_UDP;
  ip->hdr_checksum = 0;
  ip->src_addr = o_.agg_ip_be;
  ip->dst_addr = dst_ip;
  udp->src_port = sport_be;
  udp->dst_port = dport_be;
  udp->dgram_len = htons(static_cast<uint16_t>(sizeof(rte_udp_hdr) + len));
  udp->dgram_cksum = 0;
  std::memcpy(udp + 1, data, len);
  ip->hdr_checksum = rte_ipv4_cksum(ip);
  if (o_.udp_checksum) {
    // The payload's sum is shared by every receiver of a result: only the headers differ.
    uint32_t sum = payload_sum >= 0 ? static_cast<uint32_t>(payload_sum) : rte_raw_cksum(data, len);
    sum += rte_ipv4_phdr_cksum(ip, 0);
    sum += rte_raw_cksum(udp, sizeof(rte_udp_hdr));
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    const uint16_t ck = static_cast<uint16_t>(~sum);
    udp->dgram_cksum = ck ? ck : 0xFFFF;
  }
  m->data_len = m->pkt_len = frame;
  if (port >= 0)
    emit(lc, port, m);
  else
    flood(lc, -1, m);  // the worker's MAC aged out of the port table: flood like any switch
  return true;
}

void DpdkBackend::send_result(Lcore& lc, unsigned k, const IngestResult& r, uint16_t sport_be) {
  uint32_t sent = 0;
  uint64_t bytes = 0;
  const uint16_t first = r.dest_rank == GS_RANK_ALL ? 0 : r.dest_rank;
  const uint16_t end = r.dest_rank == GS_RANK_ALL ? r.world : r.dest_rank + 1;
  const int payload_sum = o_.udp_checksum ? rte_raw_cksum(r.data, r.len) : 0;
  for (uint16_t rank = first; rank < end && rank < r.world; ++rank) {
    const Endpoint& ep = r.endpoints[rank];
    if (send_udp(lc, ep.ipv4_be, sport_be, ep.port_be, r.data, r.len, &agg_[k].ip_id, payload_sum)) {
      ++sent;
      bytes += r.len;
    }
  }
  bump(lc.c.agg_frames_out, sent);
  engine_.count_sent(k, r.job_id, sent, bytes);
  // Completion tracking: a multicast RESULT advances the job's seq on this thread.
  if (r.dest_rank == GS_RANK_ALL && r.len >= GS_HEADER_BYTES && r.data[3] == GS_MSG_RESULT) {
    uint32_t seq_be, job_be;
    uint16_t count_be;
    std::memcpy(&job_be, r.data + 4, 4);
    std::memcpy(&count_be, r.data + 18, 2);
    std::memcpy(&seq_be, r.data + 20, 4);
    const uint32_t seq = ntohl(seq_be), job = ntohl(job_be);
    JobProgress& jp = agg_[k].progress[job % kJobEntries];
    const uint32_t lock = jp.lock.load(std::memory_order_relaxed);
    jp.lock.store(lock + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    if (jp.job_id.load(std::memory_order_relaxed) != job ||
        seq_after(seq, jp.seq.load(std::memory_order_relaxed))) {
      jp.job_id.store(job, std::memory_order_relaxed);
      jp.seq.store(seq, std::memory_order_relaxed);
      jp.elems.store(0, std::memory_order_relaxed);
    }
    if (seq == jp.seq.load(std::memory_order_relaxed))
      jp.elems.store(jp.elems.load(std::memory_order_relaxed) + ntohs(count_be), std::memory_order_relaxed);
    jp.last_ns.store(lc.now_ns, std::memory_order_relaxed);
    jp.lock.store(lock + 2, std::memory_order_release);
  }
}

void DpdkBackend::agg_batch(Lcore& lc, unsigned k, rte_mbuf** m, unsigned n) {
  if (n == 0) return;
  AggState& as = agg_[k];
  engine_.begin_burst(k);
  for (unsigned i = 0; i < n; ++i) {
    rte_mbuf* b = m[i];
    // The rx task checked the headers and left the UDP payload offset in the mbuf's l2/l3 lens.
    const unsigned off = b->l2_len + b->l3_len + sizeof(rte_udp_hdr);
    const uint8_t* frame = rte_pktmbuf_mtod(b, const uint8_t*);
    const uint32_t plen = b->pkt_len - off - 0;  // pkt_len was trimmed to the UDP length
    uint16_t dport_be;
    std::memcpy(&dport_be, frame + b->l2_len + b->l3_len + 2, 2);
    bump(lc.c.agg_in);
    if (as.drop_threshold) {
      as.rng ^= as.rng << 13, as.rng ^= as.rng >> 7, as.rng ^= as.rng << 17;
      if ((as.rng >> 32) < as.drop_threshold) {
        bump(lc.c.drop_injected);
        rte_pktmbuf_free(b);
        continue;
      }
    }
    IngestResult r = engine_.ingest(k, frame + off, plen, lc.now_ns);
    if (r.kind == IngestResult::kSend) {
      bump(lc.c.agg_results);
      send_result(lc, k, r, dport_be);
    }
    rte_pktmbuf_free(b);
  }
  engine_.end_burst(k);
}

void DpdkBackend::handle_rx(Lcore& lc, unsigned port, rte_mbuf** pkts, uint16_t n) {
  for (uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    bump(lc.c.rx_frames);
    bump(lc.c.rx_bytes, m->pkt_len);
    if (m->data_len < sizeof(rte_ether_hdr) || m->nb_segs != 1) {
      bump(lc.c.drop_runt);  // (chained mbufs are not expected with our pool sizes)
      rte_pktmbuf_free(m);
      continue;
    }
    auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
    if (rte_is_unicast_ether_addr(&eth->src_addr) && !rte_is_zero_ether_addr(&eth->src_addr))
      macs_->learn(eth->src_addr, port, lc.now_s, o_.age_s);
    const uint16_t type = ntohs(eth->ether_type);
    if (type == RTE_ETHER_TYPE_IPV4 && m->data_len >= sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr)) {
      auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
      const unsigned ihl = (ip->version_ihl & 0xF) * 4u;
      const unsigned avail = m->data_len - sizeof(rte_ether_hdr);
      const bool ip_ok = (ip->version_ihl >> 4) == 4 && ihl >= 20 && ihl <= avail &&
                         ntohs(ip->total_length) >= ihl && ntohs(ip->total_length) <= avail;
      if (ip_ok) neigh_->learn(ip->src_addr, eth->src_addr, lc.now_s);
      if (ip->dst_addr == o_.agg_ip_be) {
        // Addressed to the aggregation address: gradswitch data is ours, the rest is switched.
        if (!ip_ok) {
          if (ip->next_proto_id == IPPROTO_UDP) {
            bump(lc.c.drop_bad_ipv4);
            rte_pktmbuf_free(m);
            continue;
          }
        } else if (ip->next_proto_id == IPPROTO_UDP) {
          const unsigned total = ntohs(ip->total_length);
          const bool fragment =
              (ntohs(ip->fragment_offset) & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK)) != 0;
          if (!fragment && total >= ihl + sizeof(rte_udp_hdr)) {
            auto* udp = reinterpret_cast<rte_udp_hdr*>(reinterpret_cast<uint8_t*>(ip) + ihl);
            const unsigned dport = ntohs(udp->dst_port);
            if (dport >= o_.data_port && dport < o_.data_port + o_.threads) {
              const unsigned ulen = ntohs(udp->dgram_len);
              if (ulen < sizeof(rte_udp_hdr) || ulen > total - ihl) {
                bump(lc.c.drop_bad_udp);
                rte_pktmbuf_free(m);
                continue;
              }
              // Trim Ethernet padding and anything past the UDP length; remember the offsets.
              m->l2_len = sizeof(rte_ether_hdr);
              m->l3_len = ihl;
              const uint32_t keep = sizeof(rte_ether_hdr) + ihl + ulen;
              rte_pktmbuf_trim(m, m->pkt_len - keep);
              const unsigned k = dport - o_.data_port;
              if (lc.owns_agg[k]) {
                lc.inline_m[k][lc.inline_n[k]++] = m;
                if (lc.inline_n[k] == kBurst) {
                  agg_batch(lc, k, lc.inline_m[k], kBurst);
                  lc.inline_n[k] = 0;
                }
              } else if (rte_ring_mp_enqueue(agg_[k].ring, m) != 0) {
                bump(lc.c.drop_agg_ring_full);
                rte_pktmbuf_free(m);
              }
              continue;
            }
          } else if (fragment && total >= ihl) {
            // A fragmented datagram to a data port cannot be checked here: fragments are dropped.
            bump(lc.c.drop_ip_fragment);
            rte_pktmbuf_free(m);
            continue;
          }
        }
      }
    } else if (type == RTE_ETHER_TYPE_ARP && m->data_len >= sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr)) {
      auto* arp = reinterpret_cast<rte_arp_hdr*>(eth + 1);
      if (arp->arp_hardware == htons(RTE_ARP_HRD_ETHER) && arp->arp_protocol == htons(RTE_ETHER_TYPE_IPV4)) {
        neigh_->learn(arp->arp_data.arp_sip, arp->arp_data.arp_sha, lc.now_s);
        if (answer_arp_ && arp->arp_opcode == htons(RTE_ARP_OP_REQUEST) &&
            arp->arp_data.arp_tip == o_.agg_ip_be) {
          // Turn the request into the reply, in place, and send it back where it came from.
          arp->arp_opcode = htons(RTE_ARP_OP_REPLY);
          arp->arp_data.arp_tha = arp->arp_data.arp_sha;
          arp->arp_data.arp_tip = arp->arp_data.arp_sip;
          arp->arp_data.arp_sha = o_.agg_mac;
          arp->arp_data.arp_sip = o_.agg_ip_be;
          eth->dst_addr = eth->src_addr;
          eth->src_addr = o_.agg_mac;
          bump(lc.c.arp_replies);
          emit(lc, port, m);
          continue;
        }
      }
    }
    // Ordinary L2 switching.
    if (!rte_is_unicast_ether_addr(&eth->dst_addr)) {
      bump(lc.c.l2_flooded);
      flood(lc, port, m);
      continue;
    }
    const int out = macs_->lookup(eth->dst_addr, lc.now_s, o_.age_s);
    if (out < 0) {
      bump(lc.c.l2_flooded);
      flood(lc, port, m);
    } else if (static_cast<unsigned>(out) == port) {
      bump(lc.c.l2_filtered);
      rte_pktmbuf_free(m);
    } else {
      bump(lc.c.l2_forwarded);
      emit(lc, out, m);
    }
  }
}

void DpdkBackend::loop(Lcore& lc) {
  rte_mbuf* pkts[kBurst];
  unsigned idle = 0;
  const bool is_main = rte_lcore_id() == rte_get_main_lcore();
  while (!halt_.load(std::memory_order_relaxed)) {
    const uint64_t start_tsc = rte_rdtsc();
    refresh_clock(lc);
    unsigned work = 0;
    for (unsigned p : lc.rx_ports) {
      const uint16_t n = rte_eth_rx_burst(ports_[p].id, 0, pkts, kBurst);
      if (n == 0) continue;
      work += n;
      handle_rx(lc, p, pkts, n);
    }
    for (unsigned k : lc.aggs) {
      if (lc.inline_n[k]) {
        agg_batch(lc, k, lc.inline_m[k], lc.inline_n[k]);
        lc.inline_n[k] = 0;
      }
      const unsigned n =
          rte_ring_sc_dequeue_burst(agg_[k].ring, reinterpret_cast<void**>(pkts), kBurst, nullptr);
      work += n;
      agg_batch(lc, k, pkts, n);
    }
    for (unsigned p : lc.tx_ports) {
      TxBuf& b = lc.tx[p];
      const unsigned room = sizeof(b.m) / sizeof(b.m[0]) - b.n;
      const unsigned n = rte_ring_sc_dequeue_burst(ports_[p].tx_ring, reinterpret_cast<void**>(b.m + b.n),
                                                   std::min(room, kBurst * 2), nullptr);
      b.n += n;
      work += n;
      flush_tx(lc, p);
    }
    // Frames this lcore queued for ports it does not transmit went through rings already.
    if (is_main) {
      if (stop_ && stop_->load(std::memory_order_relaxed)) halt_.store(true, std::memory_order_relaxed);
      if (lc.now_ns >= next_monitor_ns_) monitor(lc);
    }
    if (work) {
      bump(lc.c.busy_cycles, rte_rdtsc() - start_tsc);
      bump(lc.c.busy_iterations);
    }
    if (work == 0 && o_.idle_sleep_us && ++idle >= 64) {
      usleep(o_.idle_sleep_us);
      idle = 0;
    } else if (work) {
      idle = 0;
    }
  }
  for (unsigned p : lc.tx_ports) flush_tx(lc, p);
}

// Main lcore: completion signals and the stats file.
void DpdkBackend::monitor(Lcore& lc) {
  next_monitor_ns_ = lc.now_ns + 200'000;
  // Gather the latest seq per job across aggregation threads.
  for (unsigned idx = 0; idx < kJobEntries && o_.notify_ip_be; ++idx) {
    uint32_t job = 0, seq = 0;
    uint64_t elems = 0, last = 0;
    bool any = false;
    for (unsigned k = 0; k < o_.threads; ++k) {
      const JobProgress& jp = agg_[k].progress[idx];
      uint32_t j, s, l0;
      uint64_t e, t;
      int tries = 0;
      do {
        l0 = jp.lock.load(std::memory_order_acquire);
        j = jp.job_id.load(std::memory_order_relaxed);
        s = jp.seq.load(std::memory_order_relaxed);
        e = jp.elems.load(std::memory_order_relaxed);
        t = jp.last_ns.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
      } while (((l0 & 1) || jp.lock.load(std::memory_order_relaxed) != l0) && ++tries < 100);
      if (j == 0) continue;
      if (!any || (j == job && seq_after(s, seq)) || (j != job && t > last)) {
        if (!any || j != job) elems = 0;
        job = j, seq = s, any = true;
      }
      if (j == job && s == seq) elems += e;
      if (j == job) last = std::max(last, t);
    }
    if (!any) continue;
    Signal& sg = signals_[idx];
    if (sg.job_id != job) sg = Signal{}, sg.job_id = job;
    if (!sg.any || seq_after(seq, sg.seen)) {
      // A newer seq started: everything before it is complete (ranks start seq+1 after seq).
      if (sg.pending) {
        sg.signaled = sg.seen;
        sg.pending = false;
        uint8_t msg[32] = {};
        uint32_t v32 = htonl(kNotifyMagic);
        std::memcpy(msg, &v32, 4);
        msg[4] = 1;  // version
        msg[5] = 1;  // reason: a newer allreduce started
        v32 = htonl(job), std::memcpy(msg + 8, &v32, 4);
        v32 = htonl(sg.signaled), std::memcpy(msg + 12, &v32, 4);
        uint64_t v64 = __builtin_bswap64(sg.elems);
        std::memcpy(msg + 16, &v64, 8);
        v64 = __builtin_bswap64(sg.last_ns);
        std::memcpy(msg + 24, &v64, 8);
        if (send_udp(lc, o_.notify_ip_be, htons(o_.data_port), o_.notify_port_be, msg, sizeof msg,
                     &notify_ip_id_))
          bump(lc.c.notify_sent);
      }
      sg.any = true;
      sg.seen = seq;
      sg.pending = true;
    }
    if (seq == sg.seen) sg.elems = elems, sg.last_ns = last;
    if (sg.pending && lc.now_ns - sg.last_ns >= uint64_t{o_.notify_quiet_us} * 1000) {
      uint8_t msg[32] = {};
      uint32_t v32 = htonl(kNotifyMagic);
      std::memcpy(msg, &v32, 4);
      msg[4] = 1;
      msg[5] = 2;  // reason: no result for notify-quiet-us
      v32 = htonl(job), std::memcpy(msg + 8, &v32, 4);
      v32 = htonl(sg.seen), std::memcpy(msg + 12, &v32, 4);
      uint64_t v64 = __builtin_bswap64(sg.elems);
      std::memcpy(msg + 16, &v64, 8);
      v64 = __builtin_bswap64(sg.last_ns);
      std::memcpy(msg + 24, &v64, 8);
      // The neighbour may still be unknown (an ARP request went out): retry on the next tick.
      if (send_udp(lc, o_.notify_ip_be, htons(o_.data_port), o_.notify_port_be, msg, sizeof msg,
                   &notify_ip_id_)) {
        bump(lc.c.notify_sent);
        sg.signaled = sg.seen;
        sg.pending = false;
      }
    }
  }
  if (lc.now_ns >= next_port_snapshot_ns_) {
    next_port_snapshot_ns_ = lc.now_ns + 100'000'000;
    snapshot_ports();
  }
  if (!o_.stats_file.empty() && lc.now_ns >= next_stats_ns_) {
    next_stats_ns_ = lc.now_ns + uint64_t{o_.stats_interval_ms} * 1000000ull;
    write_stats();
  }
}

void DpdkBackend::snapshot_ports() {
  for (size_t i = 0; i < ports_.size(); ++i) {
    rte_eth_stats st;
    if (rte_eth_stats_get(ports_[i].id, &st) != 0) continue;
    PortSnapshot& p = port_stats_[i];
    p.ipackets.store(st.ipackets, std::memory_order_relaxed);
    p.opackets.store(st.opackets, std::memory_order_relaxed);
    p.ibytes.store(st.ibytes, std::memory_order_relaxed);
    p.obytes.store(st.obytes, std::memory_order_relaxed);
    p.imissed.store(st.imissed, std::memory_order_relaxed);
    p.ierrors.store(st.ierrors, std::memory_order_relaxed);
    p.oerrors.store(st.oerrors, std::memory_order_relaxed);
    p.rx_nombuf.store(st.rx_nombuf, std::memory_order_relaxed);
  }
}

std::vector<BackendStat> DpdkBackend::stats() const {
  using Kind = BackendStat::Kind;
  std::vector<BackendStat> out;
  unsigned i = 0;
#define GS_X(name, help)                                                                     \
  out.push_back({#name, help, Kind::kCounter, 0});                                           \
  for (const auto& lc : lcores_) out[i].value += lc->c.name.load(std::memory_order_relaxed); \
  ++i;
  GS_DPDK_COUNTERS(GS_X)
#undef GS_X
  for (const auto& lc : lcores_) {
    out.push_back({"busy_cycles", "TSC cycles of this lcore's loop iterations that handled frames",
                   Kind::kCounter, lc->c.busy_cycles.load(std::memory_order_relaxed), "lcore", lc->lcore_id});
    out.push_back({"busy_iterations", "Loop iterations of this lcore that handled frames", Kind::kCounter,
                   lc->c.busy_iterations.load(std::memory_order_relaxed), "lcore", lc->lcore_id});
    out.push_back({"lcore_rx_frames", "Frames this lcore received from its ports", Kind::kCounter,
                   lc->c.rx_frames.load(std::memory_order_relaxed), "lcore", lc->lcore_id});
  }
  out.push_back({"tsc_hz", "Frequency of the TSC that busy_cycles counts", Kind::kGauge, rte_get_tsc_hz()});
  for (size_t p = 0; p < ports_.size(); ++p) {
    const PortSnapshot& s = port_stats_[p];
    const unsigned id = ports_[p].id;
    auto add = [&](const char* name, const char* help, const std::atomic<uint64_t>& v) {
      out.push_back({name, help, Kind::kCounter, v.load(std::memory_order_relaxed), "port", id});
    };
    add("port_rx_packets", "Frames the port received (ethdev ipackets)", s.ipackets);
    add("port_tx_packets", "Frames the port transmitted (ethdev opackets)", s.opackets);
    add("port_rx_bytes", "Bytes the port received", s.ibytes);
    add("port_tx_bytes", "Bytes the port transmitted", s.obytes);
    add("port_rx_missed", "Frames the port dropped because the switch did not poll fast enough", s.imissed);
    add("port_rx_errors", "Erroneous frames the port received", s.ierrors);
    add("port_tx_errors", "Frames the port failed to transmit", s.oerrors);
    add("port_rx_nombuf", "Receive failures for lack of mbufs", s.rx_nombuf);
  }
  const uint32_t now_s = static_cast<uint32_t>(monotonic_ns() / 1000000000ull);
  out.push_back(
      {"macs_live", "MAC addresses learned and not aged out", Kind::kGauge, macs_->live(now_s, o_.age_s)});
  return out;
}

// The optional --stats-file: the backend's stats, the MAC and neighbour tables and the engine's
// totals as key=value lines, rewritten atomically.
void DpdkBackend::write_stats() {
  std::string out = format_backend_stats(*this);
  for (char& ch : out)
    if (ch == ' ') ch = '\n';
  out += "\n";
  for (const Port& p : ports_) {
    const std::string pre = "port" + std::to_string(p.id) + ".";
    out += pre + "driver=" + p.driver + "\n" + pre + "iface=" + p.iface + "\n";
  }
  const uint32_t now_s = static_cast<uint32_t>(monotonic_ns() / 1000000000ull);
  macs_->dump(&out, now_s, o_.age_s);
  neigh_->dump(&out, now_s, o_.age_s);
  std::string ef = engine_.total_counters().format("engine.");
  for (char& ch : ef)
    if (ch == ' ') ch = '\n';
  out += ef + "\n";
  out += "time_ns=" + std::to_string(monotonic_ns()) + "\n";
  const std::string tmp = o_.stats_file + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fwrite(out.data(), 1, out.size(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), o_.stats_file.c_str());
  }
}

int DpdkBackend::lcore_entry(void* arg) {
  auto* self = static_cast<DpdkBackend*>(arg);
  const unsigned id = rte_lcore_id();
  for (auto& lc : self->lcores_)
    if (lc->lcore_id == id) self->loop(*lc);
  return 0;
}

int DpdkBackend::run(const std::atomic<bool>& stop) {
  if (rte_lcore_id() != rte_get_main_lcore()) {
    GS_LOG_ERROR("dpdk: run() must be called on the thread that initialised the backend (DPDK's main lcore)");
    return 1;
  }
  stop_ = &stop;
  halt_.store(false);
  GS_LOG_INFO("%s", describe_.c_str());
  for (size_t i = 1; i < lcores_.size(); ++i) {
    int r = rte_eal_remote_launch(lcore_entry, this, lcores_[i]->lcore_id);
    if (r != 0) {
      GS_LOG_ERROR("dpdk: cannot launch lcore %u: %s", lcores_[i]->lcore_id, rte_strerror(-r));
      halt_.store(true);
      rte_eal_mp_wait_lcore();
      return 1;
    }
  }
  loop(*lcores_[0]);
  rte_eal_mp_wait_lcore();
  // Drain what is left in the rings; the ports stop in shutdown().
  for (unsigned k = 0; k < o_.threads; ++k) {
    void* m;
    while (rte_ring_dequeue(agg_[k].ring, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
  }
  for (const Port& p : ports_) {
    void* m;
    while (rte_ring_dequeue(p.tx_ring, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
  }
  for (auto& lc : lcores_)
    for (unsigned k = 0; k < kMaxAgg; ++k) {
      rte_pktmbuf_free_bulk(lc->inline_m[k], lc->inline_n[k]);
      lc->inline_n[k] = 0;
    }
  snapshot_ports();
  if (!o_.stats_file.empty()) write_stats();
  GS_LOG_INFO("dpdk: stopped");
  return 0;
}

void DpdkBackend::shutdown() {
  if (!started_) return;
  started_ = false;
  for (const Port& p : ports_) {
    rte_eth_dev_stop(p.id);
    rte_eth_dev_close(p.id);
  }
  rte_eal_cleanup();
}

bool has_arg(const std::vector<std::string>& v, std::initializer_list<const char*> names) {
  for (const std::string& a : v)
    for (const char* n : names) {
      const size_t len = std::strlen(n);
      if (a == n || (a.compare(0, len, n) == 0 && (a.size() > len && (a[len] == '=' || n[1] != '-'))))
        return true;
    }
  return false;
}

bool parse_options(const std::vector<std::string>& v, Options* o, std::string* error) {
  for (size_t i = 0; i < v.size(); ++i) {
    std::string name = v[i], value;
    bool has_value = false;
    if (size_t eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto need = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= v.size()) return *error = name + " needs a value", false;
      value = v[++i];
      return true;
    };
    uint64_t u = 0;
    auto num = [&](uint64_t lo, uint64_t hi) -> bool {
      if (!need()) return false;
      if (!parse_unsigned(value, lo, hi, &u))
        return *error = name + ": expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                        ", got '" + value + "'",
               false;
      return true;
    };
    if (name == "--agg-ip") {
      if (!need()) return false;
      if (!parse_ipv4(value, &o->agg_ip_be)) return *error = "--agg-ip: not an IPv4 address: " + value, false;
    } else if (name == "--agg-prefix") {
      if (!num(0, 32)) return false;
      o->agg_prefix = u;
    } else if (name == "--agg-mac") {
      if (!need()) return false;
      if (rte_ether_unformat_addr(value.c_str(), &o->agg_mac) != 0)
        return *error = "--agg-mac: bad MAC " + value, false;
      o->have_agg_mac = true;
    } else if (name == "--layout") {
      if (!need()) return false;
      if (value != "auto" && value != "8a" && value != "8b" && value != "io" && value != "single")
        return *error = "--layout: expected auto|8b|8a|io|single, got '" + value + "'", false;
      o->layout = value;
    } else if (name == "--no-tap-config") {
      o->configure_tap = false;
    } else if (name == "--answer-arp") {
      if (!need()) return false;
      if (value != "auto" && value != "on" && value != "off")
        return *error = "--answer-arp: expected auto|on|off, got '" + value + "'", false;
      o->answer_arp = value;
    } else if (name == "--notify") {
      if (!need()) return false;
      size_t colon = value.rfind(':');
      if (colon == std::string::npos || !parse_ipv4(value.substr(0, colon), &o->notify_ip_be) ||
          !parse_unsigned(value.substr(colon + 1), 1, 65535, &u))
        return *error = "--notify: expected IPv4:PORT, got '" + value + "'", false;
      o->notify_port_be = htons(static_cast<uint16_t>(u));
    } else if (name == "--notify-quiet-us") {
      if (!num(1, 60'000'000)) return false;
      o->notify_quiet_us = u;
    } else if (name == "--mac-age") {
      if (!num(1, 86400)) return false;
      o->age_s = u;
    } else if (name == "--idle-sleep-us") {
      if (!num(0, 1'000'000)) return false;
      o->idle_sleep_us = u;
    } else if (name == "--udp-checksum") {
      if (!need()) return false;
      if (value != "on" && value != "off") return *error = "--udp-checksum: expected on|off", false;
      o->udp_checksum = value == "on";
    } else if (name == "--stats-file") {
      if (!need()) return false;
      o->stats_file = value;
    } else if (name == "--stats-interval-ms") {
      if (!num(10, 3'600'000)) return false;
      o->stats_interval_ms = u;
    } else if (name == "--mbufs") {
      if (!num(1023, 1u << 22)) return false;
      o->mbufs = u;
    } else if (name == "--ring-size") {
      if (!num(64, 1u << 20)) return false;
      if (u & (u - 1)) return *error = "--ring-size must be a power of two", false;
      o->ring_size = u;
    } else {
      return *error = "unknown DPDK backend option '" + v[i] + "' (see --backend dpdk --help)", false;
    }
  }
  return true;
}

}  // namespace

std::string dpdk_backend_help() {
  return help_text();
}

std::unique_ptr<Backend> make_dpdk_backend(Engine& engine, ControlPlane& control, const SwitchConfig& config,
                                           const std::vector<std::string>& args, std::string* error) {
  (void)control;  // the control plane runs on kernel sockets; it reaches the switch through a tap port
  return make_dpdk_backend(engine, config, args, error);
}

std::unique_ptr<Backend> make_dpdk_backend(Engine& engine, const SwitchConfig& config,
                                           const std::vector<std::string>& args, std::string* error) {
  static std::atomic<bool> eal_used{false};
  if (eal_used.exchange(true)) return *error = "DPDK's EAL can be initialised once per process", nullptr;

  std::vector<std::string> eal, own;
  bool second = false;
  for (const std::string& a : args) {
    if (!second && a == "--") {
      second = true;
      continue;
    }
    (second ? own : eal).push_back(a);
  }
  Options o;
  o.data_port = config.data_port;
  o.threads = engine.config().threads;
  o.mtu = config.mtu;
  o.drop_rate = config.drop_rate;
  o.seed = config.seed;
  if (config.control_host != "0.0.0.0") parse_ipv4(config.control_host, &o.agg_ip_be);
  if (!parse_options(own, &o, error)) return nullptr;
  if (o.agg_ip_be == 0)
    return *error =
               "the DPDK backend needs the aggregation address: add `-- --agg-ip A.B.C.D` after the EAL "
               "arguments (or give --control-host)",
           nullptr;
  if (o.data_port + o.threads - 1 > 65535) return *error = "data ports exceed 65535", nullptr;

  // Defaults that make --no-huge runs work side by side.
  if (!has_arg(eal, {"--file-prefix", "--in-memory", "--no-shconf"})) eal.push_back("--no-shconf");
  if (has_arg(eal, {"--no-huge"}) && !has_arg(eal, {"-m", "--socket-mem"})) {
    eal.push_back("-m");
    eal.push_back("256");
  }
  std::vector<std::string> argv_s{"gradswitchd"};
  argv_s.insert(argv_s.end(), eal.begin(), eal.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  if (rte_eal_init(static_cast<int>(argv_s.size()), argv.data()) < 0)
    return *error = std::string("DPDK EAL initialisation failed: ") + rte_strerror(rte_errno) +
                    " (check the EAL arguments; without hugepages use --no-huge --no-pci; root is needed for "
                    "af_xdp/af_packet/tap)",
           nullptr;
  auto b = std::make_unique<DpdkBackend>(engine, o);
  if (!b->init(error)) return nullptr;  // the destructor stops what was started
  return b;
}

}  // namespace gradswitch
