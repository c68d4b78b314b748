// The daemon's configuration: every setting and its default (the member initialisers).
//
// How a setting is spelled, parsed, printed and checked lives beside it in switch/options/: the
// option table (option_table.h) describes each option once, command_line.cpp and config_file.cpp read
// the command line and the TOML file with it, validate.h checks what involves several options.
#pragma once

#include <cstdint>
#include <string>

#include "gradswitch/wire.h"

namespace gradswitch {

struct SwitchConfig {
  // IPv4 address of the TCP control plane and UDP data ports. Loopback needs no configuration;
  // any other address needs --auth-file (or --insecure): docs/security.md.
  std::string control_host = "127.0.0.1";
  uint16_t control_port = 7700;
  uint16_t data_port = 7701;  // data thread t listens on data_port + t
  unsigned threads = 1;       // data threads; slot s is served by thread s % threads
  unsigned slots = 256;       // slots per job = the workers' window
  unsigned mtu = 1500;        // IP MTU; payload = (mtu - 60) rounded down to 4 bytes
  unsigned max_jobs = 64;
  unsigned join_timeout_s = 60;            // all ranks must have joined within this
  unsigned idle_timeout_s = 600;           // a job without packets or requests this long is aborted
  double drop_rate = 0.0;                  // injected loss of received data packets (tests)
  uint64_t seed = 1;                       // seed of the injected loss
  unsigned batch = 32;                     // datagrams per recvmmsg/sendmmsg
  unsigned hold_us = 100;                  // udp: results may wait for the next burst's (result_hold.h)
  unsigned stats_interval_s = 0;           // periodic stats log line; 0 = off
  std::string log_level = "info";          // error | warn | info | debug
  std::string log_format = "text";         // text | json (one object per line)
  uint16_t metrics_port = 0;               // HTTP GET /metrics (Prometheus); 0 = off
  std::string metrics_host = "127.0.0.1";  // where it listens (with --auth-file: bearer tokens)
  std::string backend = "udp";             // udp | dpdk
  uint64_t max_memory = 1ull << 30;        // bytes of slot memory for all jobs together
  std::string udp_gso = "on";              // on | off: UDP_SEGMENT for results sent to one worker
  std::string uplink;                      // IPv4:PORT of a spine's control plane: this switch is a leaf
  std::string auth_file;  // tenants, their secrets and quotas; "" = anonymous (docs/security.md)
  bool insecure = false;  // serve a non-loopback address without --auth-file
  // With --auth-file (docs/security.md, "the control port"): a connection that neither authenticated
  // nor joined within handshake_timeout_s is closed, and so is any connection that holds an incomplete
  // line that long; at most max_unauth_connections such connections are held (the oldest of the
  // address holding the most is closed for a new one), and max_tenant_connections authenticated ones
  // outside a job per tenant. tenant_share_percent: the default quotas (docs/protocol.md §1.5).
  unsigned handshake_timeout_s = 10;
  unsigned max_unauth_connections = 1024;
  unsigned max_tenant_connections = 64;
  unsigned tenant_share_percent = 50;

  // The DPDK backend's own options (--backend dpdk; docs/dpdk.md).
  struct Dpdk {
    std::string agg_ip;               // aggregation address; "" = --control-host unless 0.0.0.0 or loopback
    unsigned agg_prefix = 24;         // prefix length given to net_tap interfaces with agg_ip
    std::string agg_mac;              // source MAC of results; "" = the tap port's, else the first port's
    std::string layout = "auto";      // auto | 8b | 8a | io | single (lcore_layout.h)
    bool tap_config = true;           // assign agg_ip to net_tap interfaces
    std::string answer_arp = "auto";  // auto | on | off: answer ARP for agg_ip (auto: without a tap)
    std::string notify;               // IP:PORT of completion signals; "" = none
    unsigned notify_quiet_us = 1000;  // a job's latest seq is complete after this long without results
    unsigned mac_age_s = 300;         // MAC and neighbour ageing
    unsigned idle_sleep_us = 0;       // sleep after 64 idle polls; 0 = pure polling
    std::string udp_checksum = "on";  // on | off: UDP checksums of results
    std::string stats_file;           // rewritten with every counter; "" = none
    unsigned stats_interval_ms = 1000;
    unsigned mbufs = 8191;      // per port pool
    unsigned ring_size = 4096;  // entries per rte_ring, a power of two
  } dpdk;

  // Largest payload of a data packet: mtu - IPv4 (20) - UDP (8) - gradswitch header (32),
  // rounded down to a multiple of 4.
  uint32_t payload_bytes() const { return (mtu - GS_IPV4_UDP_OVERHEAD - GS_HEADER_BYTES) & ~3u; }
};

inline constexpr unsigned kMinMtu = 128;
inline constexpr unsigned kMaxThreads = 64;

}  // namespace gradswitch
