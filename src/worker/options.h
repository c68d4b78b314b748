// What a worker is told at connect(): the job, its rank, the wire type, timeouts and test hooks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace gradswitch::worker {

// A tensor's element type in memory.
enum class DType : uint8_t { kFloat32, kInt32, kFloat64 };

struct Options {
  std::string switch_addr = "127.0.0.1:7700";  // control plane host:port; "" = no switch (ring only)
  std::string job = "default";
  unsigned rank = 0;
  unsigned world = 1;
  std::string wire =
      "float32";  // how float tensors travel: float32 | fixed32 | float16 | bfloat16 | float64 | mx8 | int32
  std::string token = "gradswitch";
  // A switch with an auth file (docs/security.md): the tenant and its secret, proven by AUTH before
  // JOIN ("" = anonymous). The secret comes from the environment or a file, never a command line.
  std::string tenant;
  std::string secret;
  // Element types DATA may carry besides `wire` and int32 (JOIN types=, comma separated): what a
  // per-call wire (Group::allreduce_async's `wire`) uses, e.g. "float64".
  std::string types;
  double timeout_s = 30.0;         // an allreduce fails after this long without progress
  double join_timeout_s = 120.0;   // JOIN waits this long for the other ranks (the switch has its own)
  double connect_timeout_s = 5.0;  // TCP connect to the control port
  double drop_rate = 0.0;          // test hook: drop this fraction of outgoing data packets
  uint64_t seed = 0;               //   with a PRNG seeded from (seed, rank)
  uint64_t shuffle_seed = 0;       // test hook: != 0 permutes the order of each window's first sends
  double rto_initial_s = 0.004;    // first retransmission timeout of a round (raised by measured RTT)
  double rto_max_s = 0.2;          // backoff cap
  // Rounds in flight (docs/protocol.md 4.2, docs/transport.md): "adaptive" (a delay-based
  // controller, the pool is the cap: the rounds the path carries, fair shares of a shared link),
  // "fixed" (the whole pool, each slot on by itself), or a number n ("64": at most n rounds out of
  // the pool; n >= the pool is the whole pool).
  // `target_delay_s`: the queueing delay the adaptive window tolerates above the path's base round
  // trip. Env GRADSWITCH_WINDOW=adaptive|fixed|<n> and GRADSWITCH_TARGET_DELAY_US override them.
  std::string window = "adaptive";
  double target_delay_s = 0.001;
  int sockbuf_bytes = 4 << 20;      // UDP SO_RCVBUF/SO_SNDBUF request
  std::string bind_ip = "0.0.0.0";  // local UDP address
  bool gso = true;                  // UDP_SEGMENT for runs of DATA packets (env GRADSWITCH_GSO=1|0 overrides)
  bool gro = true;                  // UDP_GRO for result trains (env GRADSWITCH_GRO=1|0 overrides)

  // How allreduce runs (docs/algorithms.md): "switch" (aggregation in the switch), "ring" (paper
  // 001's pipelined ring among the workers; peers from the switch's JOIN reply, or below), "auto"
  // (the switch; the ring when the switch cannot be reached at connect or goes away later).
  std::string algorithm = "switch";
  // The ring's addresses without a switch: "host:port" per rank (this rank binds to its entry's
  // port), or `exchange_peers`, called once with this rank's UDP port after binding, returning
  // every rank's "host:port" in rank order (the torch store does this).
  std::vector<std::string> peers;
  std::function<std::vector<std::string>(uint16_t)> exchange_peers;
  unsigned ring_slots = 256;           // the ring's window without a switch (the switch's JOIN sets it)
  uint32_t ring_payload_bytes = 1440;  // bytes per packet without a switch (likewise)

  // Optimization in the switch (docs/optimizer.md, docs/protocol.md section 1.3). `optimizer` is
  // the algorithm (sgd, adagrad, adam, adamw, smorms3; "" = a plain allreduce job), `params` the
  // number of fp32 parameters (= the length of every allreduce), `optimizer_keys` the other JOIN
  // keys in order, values already formatted (floats: format_float32), e.g. {{"lr", "0.001"}}. The
  // switch validates them; every rank must give the same. Needs wire float32.
  std::string optimizer;
  uint64_t params = 0;
  std::vector<std::pair<std::string, std::string>> optimizer_keys;

  // Bounded-time rounds (docs/protocol.md §3.1; opt-in, every rank the same): the switch closes a
  // round `deadline_us` after its first contribution once `quorum` ranks contributed (0: the
  // switch's default, world - 1). 0 = off: every round waits for every rank. `rescale`: a float
  // chunk that lacked contributions is multiplied by world / contributors (else left as the sum of
  // those present). `straggler_report`: a rank missing from this many allreduces in a row is
  // reported (a warning, Stats::straggler_reports).
  uint32_t deadline_us = 0;
  unsigned quorum = 0;
  bool rescale = true;
  unsigned straggler_report = 10;
  // With deadline_us: this rank concedes chunks (header-only DATA, §3.1 "Concede") while its own
  // DATA completes most rounds, i.e. its uplink paces the job (switch/concede_policy.h). The chunks
  // it concedes go without its contribution, rescaled like any partial chunk. `concede_keep`: test
  // hook, a fixed share of chunks sent with data (0..1; negative: the policy decides).
  bool concede = false;
  double concede_keep = -1.0;
};

// The rounds of a numeric window option ("64" -> 64); 0 for "fixed", "adaptive" or anything else.
inline unsigned window_rounds(const std::string& window) {
  if (window.empty() || window.size() > 5 || window.find_first_not_of("0123456789") != std::string::npos)
    return 0;
  const unsigned long n = std::stoul(window);
  return n <= 65535 ? static_cast<unsigned>(n) : 0;
}

}  // namespace gradswitch::worker
