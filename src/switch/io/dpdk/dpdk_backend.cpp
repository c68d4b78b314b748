// The DPDK backend: set-up (EAL, ports, tables, rings, lcores), housekeeping on the main lcore
// (completion signals, port counters, the stats file), counters, stop. The packet path itself is
// burst_loop.cpp; what a frame is, frames.cpp.
#include "switch/io/dpdk/dpdk_backend.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/clock.h"
#include "switch/io/dpdk/checksum.h"
#include "switch/io/dpdk/dpdk_switch.h"
#include "switch/io/dpdk/lcore_layout.h"
#include "switch/log.h"
#include "switch/options/values.h"

namespace gradswitch {
namespace dpdk {
namespace {

constexpr uint64_t kMonitorPeriodNs = 200'000;           // completion signals
constexpr uint64_t kPortSnapshotPeriodNs = 100'000'000;  // ethdev counters for stats()

const char* const kHelp = R"(DPDK backend: gradswitchd [options] --backend dpdk [DPDK options] -- EAL-ARGS

The switch owns every DPDK port EAL finds (one per attached host) and is an L2 learning switch
between them: ARP, ping, TCP... pass through. IPv4/UDP packets to the aggregation address on
ports data_port .. data_port+threads-1 are summed by the engine (thread k = port - data_port) and
the result is sent to every worker of the job with rewritten Ethernet/IPv4/UDP headers.
A net_tap port gives this process's kernel stack an interface on the switched segment; the
backend assigns it the aggregation address so the TCP control plane answers through the switch.
Daemon options it uses: --data-port, --threads, --mtu, --drop-rate/--seed, --control-host.

EAL-ARGS (examples):
  -l 0,1 --no-huge --no-pci --vdev=net_af_xdp0,iface=veth1 --vdev=net_af_xdp1,iface=veth2
         --vdev=net_tap0,iface=gscp0
  production: -l 0-5 -a 0000:3b:00.0 -a 0000:3b:00.1 (PCI NICs bound to vfio-pci)
  Added when missing: --no-shconf (unless --file-prefix/--in-memory), -m 256 with --no-huge.
  net_af_xdp frames are limited to ~3.5 KB: use net_af_packet for 9000-byte MTUs.

Thread layout (--layout; P ports, X = --threads aggregation threads, L = EAL lcores):
  8b      paper 000 Fig. 8(b): one lcore per rx<p>, per tx<p>, per agg<k>; L >= 2P+X
  8a      Fig. 8(a): one lcore per port (rx+tx), one per agg<k>;       L >= P+X
  io      all port tasks on the main lcore, agg<k> spread over the others; L >= 2
  single  everything on the main lcore (L = 1 works)
  auto    the first of 8b, 8a, io, single that fits L
Rings: each agg<k> has a lock-free ring fed by the rx tasks; each port has a TX ring fed by rx and
agg tasks; a producer on the same lcore as the consumer bypasses the ring.
)";

bool has_arg(const std::vector<std::string>& v, std::initializer_list<const char*> names) {
  for (const std::string& a : v)
    for (const char* n : names) {
      const size_t len = std::strlen(n);
      if (a == n || (a.compare(0, len, n) == 0 && a.size() > len && (a[len] == '=' || n[1] != '-')))
        return true;
    }
  return false;
}

bool init_eal(std::vector<std::string> eal, std::string* error) {
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
  if (rte_eal_init(static_cast<int>(argv_s.size()), argv.data()) >= 0) return true;
  *error = std::string("DPDK EAL initialisation failed: ") + rte_strerror(rte_errno) +
           " (check the EAL arguments; without hugepages use --no-huge --no-pci; root is needed for "
           "af_xdp/af_packet/tap)";
  return false;
}

}  // namespace

DpdkSwitch::DpdkSwitch(Engine& engine, const SwitchConfig& config) : engine_(engine), config_(config) {}

DpdkSwitch::~DpdkSwitch() {
  close_ports(&ports_);
  rte_eal_cleanup();
}

// The aggregation address and MAC, ARP answering, the notify address.
bool DpdkSwitch::resolve_addresses(std::string* error) {
  const SwitchConfig::Dpdk& o = config_.dpdk;
  const std::string agg_ip = !o.agg_ip.empty() ? o.agg_ip : config_.control_host;
  std::string why;
  if (agg_ip == "0.0.0.0" || option_values::is_loopback_ipv4(agg_ip) ||
      !option_values::valid_ipv4(agg_ip, &why))
    return *error =
               "the DPDK backend needs the aggregation address: add --agg-ip A.B.C.D (or give "
               "--control-host)",
           false;
  inet_pton(AF_INET, agg_ip.c_str(), &rules_.agg_ip_be);
  rules_.data_port = config_.data_port;
  rules_.threads = config_.threads;
  bool have_local = false, have_mac = !o.agg_mac.empty();
  if (have_mac && !option_values::parse_mac(o.agg_mac, rules_.agg_mac.bytes, &why))
    return *error = why, false;
  for (const Port& p : ports_) {
    if (!p.local) continue;
    if (!have_mac) rules_.agg_mac = p.mac, have_mac = true;
    have_local = true;
    if (o.tap_config && !assign_tap_address(p.iface, rules_.agg_ip_be, o.agg_prefix, error)) return false;
  }
  if (!have_mac) {
    rules_.agg_mac = ports_[0].mac;
    rules_.agg_mac.bytes[0] = (rules_.agg_mac.bytes[0] | 0x02) & ~0x01;  // locally administered
  }
  rules_.answer_arp = o.answer_arp == "on" || (o.answer_arp == "auto" && !have_local);
  if (!o.notify.empty()) {
    uint16_t port = 0;
    if (!option_values::parse_ipv4_port(o.notify, &notify_ip_be_, &port, &why)) return *error = why, false;
    notify_port_be_ = htons(port);
  }
  udp_checksum_ = o.udp_checksum == "on";
  return true;
}

bool DpdkSwitch::place_lcores(std::string* error) {
  std::vector<unsigned> ids{rte_get_main_lcore()};
  unsigned id;
  RTE_LCORE_FOREACH_WORKER(id) ids.push_back(id);
  std::vector<LcoreTasks> plan;
  if (!plan_lcores(config_.dpdk.layout, ids.size(), ports_.size(), config_.threads, &plan, &layout_, error))
    return false;
  for (const LcoreTasks& t : plan) {
    auto lc = std::make_unique<Lcore>();
    lc->lcore_id = ids[t.lcore_index];
    lc->rx_ports = t.rx_ports;
    lc->tx_ports = t.tx_ports;
    lc->aggs = t.aggs;
    for (unsigned p : t.tx_ports) lc->owns_tx[p] = true;
    for (unsigned k : t.aggs) lc->owns_agg[k] = true;
    lcores_.push_back(std::move(lc));
  }
  return true;
}

bool DpdkSwitch::init(std::string* error) {
  if (config_.threads == 0 || config_.threads > kMaxAgg)
    return *error = "threads must be 1.." + std::to_string(kMaxAgg), false;
  PortSettings ps;
  ps.mtu = config_.mtu;
  ps.mbufs = config_.dpdk.mbufs;
  ps.ring_size = config_.dpdk.ring_size;
  if (!open_ports(ps, kMaxPorts, &ports_, error)) return false;
  port_stats_ = std::make_unique<PortSnapshot[]>(ports_.size());
  macs_ = std::make_unique<MacTable>();
  neighbours_ = std::make_unique<NeighbourTable>();
  completion_ = std::make_unique<CompletionMonitor>(uint64_t{config_.dpdk.notify_quiet_us} * 1000);
  if (!resolve_addresses(error)) return false;
  agg_ = std::make_unique<AggThread[]>(config_.threads);
  for (unsigned k = 0; k < config_.threads; ++k) {
    const std::string name = "gs_agg" + std::to_string(k);
    agg_[k].ring = rte_ring_create(name.c_str(), config_.dpdk.ring_size, rte_socket_id(), RING_F_SC_DEQ);
    if (!agg_[k].ring) return *error = "agg ring: " + std::string(rte_strerror(rte_errno)), false;
    agg_[k].loss = LossInjector(config_.drop_rate, config_.seed, k);
    completion_records_.push_back(&agg_[k].completion);
  }
  if (!place_lcores(error)) return false;
  preempted_cycles_ = rte_get_tsc_hz() / 1'000'000'000.0 * kPreemptedIterationNs;
  build_description();
  return true;
}

void DpdkSwitch::build_description() {
  std::ostringstream d;
  d << "dpdk: " << ports_.size() << " ports [";
  for (const Port& p : ports_)
    d << (p.id ? " " : "") << p.id << "=" << p.driver << ":" << p.iface << (p.local ? "(local)" : "");
  d << "], agg " << ipv4_to_string(rules_.agg_ip_be) << " udp " << config_.data_port << ".."
    << config_.data_port + config_.threads - 1 << " mac " << mac_to_string(rules_.agg_mac) << ", layout "
    << layout_ << ":";
  for (const auto& lc : lcores_) {
    d << " lcore" << lc->lcore_id << "=[";
    std::string sep;
    for (unsigned p : lc->rx_ports) d << sep << "rx" << p, sep = " ";
    for (unsigned p : lc->tx_ports) d << sep << "tx" << p, sep = " ";
    for (unsigned k : lc->aggs) d << sep << "agg" << k, sep = " ";
    d << "]";
  }
  if (rules_.answer_arp) d << ", answers ARP";
  if (notify_ip_be_) d << ", notify " << ipv4_to_string(notify_ip_be_) << ":" << ntohs(notify_port_be_);
  describe_ = d.str();
}

// Main lcore, every iteration (cheap unless something is due).
void DpdkSwitch::housekeeping(Lcore& lc) {
  if (stop_ && stop_->load(std::memory_order_relaxed)) halt_.store(true, std::memory_order_relaxed);
  if (notify_ip_be_ && lc.now_ns >= next_monitor_ns_) {
    next_monitor_ns_ = lc.now_ns + kMonitorPeriodNs;
    completion_->tick(completion_records_, lc.now_ns, [&](const gs_notify& n) {
      uint8_t datagram[GS_NOTIFY_BYTES];
      gs_notify_encode(&n, datagram);
      const bool sent = send_udp(lc, notify_ip_be_, htons(config_.data_port), notify_port_be_, datagram,
                                 sizeof datagram, checksum_add(0, datagram, sizeof datagram), &notify_ip_id_);
      if (sent) bump(lc.c.notify_sent);
      return sent;
    });
  }
  if (lc.now_ns >= next_port_snapshot_ns_) {
    next_port_snapshot_ns_ = lc.now_ns + kPortSnapshotPeriodNs;
    snapshot_ports();
  }
  if (!config_.dpdk.stats_file.empty() && lc.now_ns >= next_stats_ns_) {
    next_stats_ns_ = lc.now_ns + uint64_t{config_.dpdk.stats_interval_ms} * 1'000'000;
    write_stats_file();
  }
}

void DpdkSwitch::snapshot_ports() {
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

std::vector<BackendStat> DpdkSwitch::stats() const {
  using Kind = BackendStat::Kind;
  std::vector<BackendStat> out;
  size_t i = 0;
#define GS_X(name, help)                                                                     \
  out.push_back({#name, help, Kind::kCounter, 0});                                           \
  for (const auto& lc : lcores_) out[i].value += lc->c.name.load(std::memory_order_relaxed); \
  ++i;
  GS_DPDK_COUNTERS(GS_X)
#undef GS_X
  for (const auto& lc : lcores_) {
    auto add = [&](const char* name, const char* help, const std::atomic<uint64_t>& v) {
      out.push_back({name, help, Kind::kCounter, v.load(std::memory_order_relaxed), "lcore", lc->lcore_id});
    };
    add("busy_cycles", "TSC cycles of this lcore's loop iterations that handled frames", lc->c.busy_cycles);
    add("busy_iterations", "Loop iterations of this lcore that handled frames", lc->c.busy_iterations);
    add("busy_frames", "Frames (received or from a ring) handled in those iterations", lc->c.busy_frames);
    add("preempted_iterations", "Iterations with frames that took over 0.5 ms (the lcore lost its CPU)",
        lc->c.preempted_iterations);
    add("preempted_frames", "Frames handled in those iterations", lc->c.preempted_frames);
    add("lcore_rx_frames", "Frames this lcore received from its ports", lc->c.rx_frames);
  }
  out.push_back({"tsc_hz", "Frequency of the TSC that busy_cycles counts", Kind::kGauge, rte_get_tsc_hz()});
  for (size_t p = 0; p < ports_.size(); ++p) {
    const PortSnapshot& s = port_stats_[p];
    auto add = [&](const char* name, const char* help, const std::atomic<uint64_t>& v) {
      out.push_back({name, help, Kind::kCounter, v.load(std::memory_order_relaxed), "port", ports_[p].id});
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
  const uint32_t now_s = static_cast<uint32_t>(monotonic_ns() / 1'000'000'000);
  const uint32_t age = config_.dpdk.mac_age_s;
  out.push_back(
      {"macs_live", "MAC addresses learned and not aged out", Kind::kGauge, macs_->live(now_s, age)});
  out.push_back({"neighbours_live", "IPv4 neighbours learned and not aged out", Kind::kGauge,
                 neighbours_->live(now_s, age)});
  return out;
}

// --stats-file: the counters one per line, the port names, the MAC and neighbour tables and the
// engine's totals, rewritten atomically.
void DpdkSwitch::write_stats_file() {
  std::string out = format_backend_stats(*this) + " " + engine_.total_counters().format("engine.");
  std::replace(out.begin(), out.end(), ' ', '\n');
  out += "\n";
  for (const Port& p : ports_) {
    const std::string pre = "port" + std::to_string(p.id) + ".";
    out += pre + "driver=" + p.driver + "\n" + pre + "iface=" + p.iface + "\n";
  }
  const uint32_t now_s = static_cast<uint32_t>(monotonic_ns() / 1'000'000'000);
  macs_->dump(&out, now_s, config_.dpdk.mac_age_s);
  neighbours_->dump(&out, now_s, config_.dpdk.mac_age_s);
  out += "time_ns=" + std::to_string(monotonic_ns()) + "\n";
  const std::string& path = config_.dpdk.stats_file;
  const std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fwrite(out.data(), 1, out.size(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

int DpdkSwitch::lcore_entry(void* arg) {
  auto* self = static_cast<DpdkSwitch*>(arg);
  const unsigned id = rte_lcore_id();
  for (auto& lc : self->lcores_)
    if (lc->lcore_id == id) self->loop(*lc);
  return 0;
}

int DpdkSwitch::run(const std::atomic<bool>& stop) {
  if (rte_lcore_id() != rte_get_main_lcore()) {
    GS_LOG_ERROR("dpdk: run() must be called on the thread that initialised the backend (DPDK's main lcore)");
    return 1;
  }
  stop_ = &stop;
  halt_.store(false);
  GS_LOG_INFO("%s", describe_.c_str());
  for (size_t i = 1; i < lcores_.size(); ++i) {
    const int r = rte_eal_remote_launch(lcore_entry, this, lcores_[i]->lcore_id);
    if (r != 0) {
      GS_LOG_ERROR("dpdk: cannot launch lcore %u: %s", lcores_[i]->lcore_id, rte_strerror(-r));
      halt_.store(true);
      rte_eal_mp_wait_lcore();
      return 1;
    }
  }
  loop(*lcores_[0]);
  rte_eal_mp_wait_lcore();
  // Free what is left in the rings; the ports stop when the backend is destroyed.
  void* m;
  for (unsigned k = 0; k < config_.threads; ++k)
    while (rte_ring_dequeue(agg_[k].ring, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
  for (const Port& p : ports_)
    while (rte_ring_dequeue(p.tx_ring, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
  for (auto& lc : lcores_)
    for (unsigned k = 0; k < kMaxAgg; ++k) {
      rte_pktmbuf_free_bulk(lc->inline_m[k], lc->inline_n[k]);
      lc->inline_n[k] = 0;
    }
  snapshot_ports();
  if (!config_.dpdk.stats_file.empty()) write_stats_file();
  GS_LOG_INFO("dpdk: stopped");
  return 0;
}

}  // namespace dpdk

std::string dpdk_backend_help() {
  return dpdk::kHelp;
}

std::unique_ptr<Backend> make_dpdk_backend(Engine& engine, const SwitchConfig& config,
                                           const std::vector<std::string>& eal_args, std::string* error) {
  static std::atomic<bool> eal_used{false};
  if (eal_used.exchange(true)) return *error = "DPDK's EAL can be initialised once per process", nullptr;
  if (config.data_port + config.threads - 1 > 65535) return *error = "data ports exceed 65535", nullptr;
  if (!dpdk::init_eal(eal_args, error)) return nullptr;
  auto b = std::make_unique<dpdk::DpdkSwitch>(engine, config);
  if (!b->init(error)) return nullptr;  // the destructor stops what was started
  return b;
}

}  // namespace gradswitch
