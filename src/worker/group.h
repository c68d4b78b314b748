// A worker's membership in one gradswitch job: allreduce through the switch.
//
// Group::connect joins the job over TCP (blocks until every rank joined), then each
// allreduce streams the tensor through the job's slot pool (docs/protocol.md, worker
// algorithm). Operations run in order on the group's own background thread; allreduce()
// is allreduce_async().wait().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/control.h"
#include "worker/errors.h"
#include "worker/transport.h"

namespace gradswitch::worker {

enum class DType : uint8_t { kFloat32, kInt32 };

struct Options {
  std::string switch_addr = "127.0.0.1:7700";  // control plane host:port
  std::string job = "default";
  unsigned rank = 0;
  unsigned world = 1;
  std::string wire = "float32";  // int32 | float32 | fixed32 | float16 | bfloat16
  std::string token = "gradswitch";
  double timeout_s = 30.0;          // an allreduce fails after this long without progress
  double join_timeout_s = 120.0;    // JOIN waits this long for the other ranks (the switch has its own)
  double connect_timeout_s = 5.0;   // TCP connect to the control port
  double drop_rate = 0.0;           // test hook: drop this fraction of outgoing data packets
  uint64_t seed = 0;                //   with a PRNG seeded from (seed, rank)
  uint64_t shuffle_seed = 0;        // test hook: != 0 permutes the order of each window's first sends
  double rto_initial_s = 0.004;     // first retransmission timeout of a round (raised by measured RTT)
  double rto_max_s = 0.2;           // backoff cap
  int sockbuf_bytes = 4 << 20;      // UDP SO_RCVBUF/SO_SNDBUF request
  std::string bind_ip = "0.0.0.0";  // local UDP address
  bool gso = true;                  // UDP_SEGMENT for runs of DATA packets (env GRADSWITCH_GSO=1|0 overrides)
  bool gro = true;                  // UDP_GRO for result trains (env GRADSWITCH_GRO=1|0 overrides)

  // Optimization in the switch (docs/optimizer.md, docs/protocol.md section 1.3). `optimizer` is
  // the algorithm (sgd, adagrad, adam, adamw, smorms3; "" = a plain allreduce job), `params` the
  // number of fp32 parameters (= the length of every allreduce), `optimizer_keys` the other JOIN
  // keys in order, values already formatted (floats: format_float32), e.g. {{"lr", "0.001"}}. The
  // switch validates them; every rank must give the same. Needs wire float32.
  std::string optimizer;
  uint64_t params = 0;
  std::vector<std::pair<std::string, std::string>> optimizer_keys;
};

struct Stats {
  uint64_t allreduces = 0;
  uint64_t packets_sent = 0, bytes_sent = 0;
  uint64_t packets_received = 0, bytes_received = 0;
  uint64_t retransmissions = 0;   // DATA packets resent after a timer fired
  uint64_t injected_drops = 0;    // DATA packets dropped by the drop_rate hook
  uint64_t ignored = 0;           // received datagrams matching no outstanding round (late duplicates, ...)
  uint64_t unicast_results = 0;   // results answering a retransmission
  uint64_t bootstrap_rounds = 0;  // fixed32 exponent rounds (count = 0)
};

// Shared completion state of one queued operation.
class Handle {
 public:
  Handle() = default;
  // Blocks until the operation finished; rethrows its error.
  void wait() const;
  // Waits at most `seconds`; true once finished (then wait() returns or throws at once).
  bool wait_for(double seconds) const;
  // True once finished (successfully or not).
  bool done() const;

  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  explicit Handle(std::shared_ptr<State> s) : s_(std::move(s)) {}

 private:
  std::shared_ptr<State> s_;
};

class Group {
 public:
  // Connects to the switch, joins the job (blocking until all ranks joined) and starts the
  // background thread. Throws Error / TimeoutError / InvalidArgument.
  static std::unique_ptr<Group> connect(const Options& opt);
  // For tests: a group over a given transport with a known JoinInfo (no control connection;
  // a timeout then reports without STATUS).
  Group(const Options& opt, std::unique_ptr<Transport> transport, std::unique_ptr<ControlClient> control,
        const JoinInfo& join, uint32_t switch_ipv4_be);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Sums `count` elements at `data` over all ranks, in place. The memory must stay valid and
  // untouched until the handle completes.
  Handle allreduce_async(void* data, size_t count, DType dtype);
  void allreduce(void* data, size_t count, DType dtype) { allreduce_async(data, count, dtype).wait(); }

  // ---- Optimizer jobs (Options::optimizer). Each call is queued on the background thread behind
  // the operations queued before it, so it runs between two allreduces, as the protocol requires.
  // With an optimizer, allreduce takes the gradient (float32, exactly `params` elements) and writes
  // the updated parameters into the same array.
  //
  // Rank 0 only, before the first allreduce: the initial parameters (n must equal `params`).
  // Without it the switch's parameters start as zeros (or come from state_set).
  Handle upload_params_async(const float* data, size_t n);  // `data` stays valid until the handle completes
  void upload_params(const float* data, size_t n) { upload_params_async(data, n).wait(); }
  // The learning rate of the following steps (any rank; normally rank 0). Returns the value stored
  // at the switch (the float32 nearest `lr`).
  float set_lr(float lr);
  // The checkpoint blob (parameters, optimizer state, step counters, lr; layout in docs/protocol.md
  // section 1.3). Any rank; also allowed after the job failed or was aborted.
  std::vector<uint8_t> state_get();
  // Restores a blob from state_get of a job with the same algorithm, params and chunking. Rank 0 only.
  void state_set(const uint8_t* data, size_t n);

  // Finishes queued operations, leaves the job (LEAVE) and stops the thread. Idempotent.
  // With abort = true: the running and queued operations fail at once ("cancelled") and the
  // control connection is closed without LEAVE, so the switch aborts the job and the other
  // ranks get a JobAborted naming this rank instead of a timeout.
  void close(bool abort = false);
  bool closed() const { return closed_.load(); }

  Stats stats() const;
  const Options& options() const { return opt_; }
  const JoinInfo& join_info() const { return join_; }
  uint8_t wire_elem_type() const { return wire_; }
  uint32_t next_seq() const { return seq_; }  // racy when operations are queued

 private:
  struct Op {
    void* data;
    size_t count;
    DType dtype;
    std::shared_ptr<Handle::State> state;
    std::function<void()> fn;  // a control-plane operation instead of an allreduce
  };
  struct Run;  // per-allreduce streaming state (group.cpp)

  Handle enqueue(Op op);
  void require_optimizer(const char* what) const;
  double control_timeout(size_t bytes) const;
  void thread_main();
  void run_allreduce(void* data, size_t count, DType dtype);
  [[noreturn]] void fail_timeout(Run& run);
  std::string describe_job() const;

  Options opt_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ControlClient> control_;
  JoinInfo join_;
  uint32_t switch_ipv4_be_ = 0;
  uint8_t wire_ = 0;

  // Persistent data-plane state (background thread only).
  uint32_t seq_ = 0;
  std::vector<uint8_t> version_;  // per slot: version of its next round
  uint64_t rng_state_ = 0;
  double srtt_ns_ = 0, rttvar_ns_ = 0;
  size_t pkt_cap_ = 0;              // bytes per packet buffer (header + payload, rounded up)
  std::vector<uint8_t> slot_mem_;   // one packet buffer per slot (retransmissions resend it)
  std::vector<int8_t> exps_;        // fixed32: this rank's block exponent per chunk
  std::exception_ptr fatal_;  // set after a timeout or abort: the group is unusable

  // Queue.
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> closed_{false};
  std::mutex close_mu_;
  std::thread thread_;

  struct AtomicStats {
    std::atomic<uint64_t> allreduces{0}, packets_sent{0}, bytes_sent{0}, packets_received{0}, bytes_received{0},
        retransmissions{0}, injected_drops{0}, ignored{0}, unicast_results{0}, bootstrap_rounds{0};
  } stats_;
};

// Parses a wire name; throws InvalidArgument for unknown names.
uint8_t parse_wire(const std::string& name);

}  // namespace gradswitch::worker
