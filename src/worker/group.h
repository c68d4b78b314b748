// A worker's membership in one gradswitch job: allreduce through the switch, or on the ring
// among the workers (docs/algorithms.md).
//
// Group::connect joins the job over TCP (blocks until every rank joined), then each
// allreduce streams the tensor through the job's slot pool (docs/protocol.md, worker
// algorithm), or along the ring (section 7). With algorithm "auto" a switch that cannot be
// reached at connect, or that goes away later, hands the job over to the ring. Operations run in
// order on the group's own background thread; allreduce() is allreduce_async().wait().
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/control.h"
#include "worker/counters.h"
#include "worker/errors.h"
#include "worker/options.h"
#include "worker/path.h"
#include "worker/ring/ring_allreduce.h"
#include "worker/switch/sharded_allreduce.h"
#include "worker/timeline.h"
#include "worker/transport.h"

namespace gradswitch::worker {

// The switches of Options::switch_addr: "host:port" or "host:port,host:port,..." (a sharded job).
std::vector<std::string> switch_list(const std::string& addrs);

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
  // Once finished: the contributions its rounds lacked (bounded-time rounds, docs/protocol.md §3.1;
  // 0 otherwise), summed over its chunks.
  uint64_t missed() const;

  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    uint64_t missed = 0;
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
  // a timeout then reports without STATUS). A JoinInfo with data_port 0 means no switch: the
  // ring alone. `ring_peers` (else the JoinInfo's peers=) are the ring's addresses.
  // `more_switches`: a job sharded over several switches (Options::switch_addr lists them): the
  // others beyond the first (`control`, `join`), joined the same way (switch/sharded_allreduce.h).
  Group(const Options& opt, std::unique_ptr<Transport> transport, std::unique_ptr<ControlClient> control,
        const JoinInfo& join, uint32_t switch_ipv4_be, std::vector<RingPeer> ring_peers = {},
        std::vector<SwitchLink> more_switches = {});
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Sums `count` elements at `data` over all ranks, in place. The memory must stay valid and
  // untouched until the handle completes.
  Handle allreduce_async(void* data, size_t count, DType dtype) {
    return allreduce_async(data, data, count, dtype);
  }
  void allreduce(void* data, size_t count, DType dtype) { allreduce_async(data, count, dtype).wait(); }
  // The same, reading `src` and writing the sum into `dst` (`src` is never written; `dst` may be
  // `src`, or nullptr to discard the sum). `wire` (a gs_elem_type; 0 = the group's wire) is how a
  // float tensor travels in this call: a caller that knows every rank makes the same choice (an MPI
  // library: each MPI datatype as its own type) may differ from the wire agreed at JOIN.
  Handle allreduce_async(const void* src, void* dst, size_t count, DType dtype, uint8_t wire = 0);
  // In a job with bounded-time rounds (Options::deadline_us), float32 only: the same, and for every
  // chunk whose sum lacks this rank's contribution (the rank conceded it, or its deadline closed the
  // round without it) this rank's values of the chunk are copied into `unsummed` (`count` long, at
  // the same offsets), less the estimate of them that a rescaled sum holds (Options::rescale: the
  // sum / world); its other elements are left as they are. What error feedback keeps for the next
  // step, so that a rank's contribution is delayed, never lost.
  Handle allreduce_async(void* data, size_t count, float* unsummed);

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
  uint32_t next_seq() const { return seq_; }  // racy when operations are queued
  // "switch" or "ring": where allreduces run now (a fallback changes it once).
  std::string algorithm() const { return algorithm_.load(); }

 private:
  struct Op {
    void* data;  // where the sum goes (nullptr: discarded)
    size_t count;
    DType dtype;
    std::shared_ptr<Handle::State> state;
    std::function<void()> fn;   // a control-plane operation instead of an allreduce
    const void* src = nullptr;  // what is summed
    uint8_t wire = 0;           // 0: the group's wire
    float* unsummed = nullptr;  // where this rank's values of the chunks the sum lacks go
    int64_t queued_ns = 0;      // when it was queued (timeline, debug log)
  };
  // Group::connect's last step without a switch (none given, or unreachable with algorithm auto:
  // `unreachable` says why): the ring alone, on the addresses the application gives.
  static std::unique_ptr<Group> join_ring(const Options& opt, std::unique_ptr<Transport> transport,
                                          std::vector<RingPeer> given, const std::string& unreachable);
  Handle enqueue(Op op);
  void require_optimizer(const char* what) const;
  double control_timeout(size_t bytes) const;
  // An admitted allreduce: its description for the data path, and whom to tell when it is done.
  struct Flight {
    Op op;
    AllreduceOp ar;
    std::vector<int8_t> exps;   // fixed32: this rank's block exponent per chunk
    std::vector<uint8_t> done;  // per chunk: its sum is in the tensor (switch path)
    int64_t admitted_ns = 0;    // timeline, debug log
    AllreduceTimes times;       // likewise (ar.times points here when either is on)
  };
  void thread_main();
  // The data path, chosen once here: the ring (algorithm ring, or no switch), else the switch's
  // (ShardedAllreduce for a job over several switches).
  void choose_path();
  void use_path(std::unique_ptr<DataPath> p);
  // Validates a queued allreduce and describes it for the data path (seq, chunks, exponents);
  // false when there is nothing to sum. Throws for bad arguments or a failed group.
  bool prepare(Flight& f);
  void admit(Op&& op);
  // Tells the waiter that an admitted allreduce finished (err: how it failed), after its timeline
  // events and debug log line (group_trace.cpp).
  void finish(Flight& f, std::exception_ptr err);
  // Bounded-time rounds: a finished allreduce's missing ranks, and the report of a rank missing from
  // Options::straggler_report allreduces in a row.
  void note_missing(const AllreduceOp& ar);
  void trace_allreduce(const Flight& f, int64_t end_ns, const std::exception_ptr& err);
  // `f`: the allreduce's flight, null for a control-plane operation.
  void log_operation(const Op& op, const Flight* f, int64_t start_ns, const std::exception_ptr& err);
  // A sharded job whose group failed because one of its switches is gone: that switch ("host:port"),
  // else "". Read by close() once the thread has stopped.
  std::string lost_switch() const;
  // The data path failed: a lost switch hands the allreduces in flight to the ring (algorithm
  // auto); anything else fails them and the group.
  void stream_failed(std::exception_ptr err);
  void fall_back(const std::string& why);
  // One line on stderr: the job goes on, but the user should know.
  void warn(const std::string& what) const;
  // Switches this group to the ring for good (the switch is gone, or never was).
  void start_ring(const std::string& why);
  // Between operations: serve the ring until an operation is queued or the group stops.
  void wait_for_work(std::unique_lock<std::mutex>& lk);
  std::string describe_job() const;

  Options opt_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ControlClient> control_;
  JoinInfo join_;
  uint32_t switch_ipv4_be_ = 0;
  uint8_t wire_ = 0;

  // Data-plane state (background thread only).
  PathContext ctx_;
  std::unique_ptr<DataPath> path_;         // choose_path()'s; the ring's after a fallback
  std::vector<SwitchLink> more_switches_;  // a sharded job: the switches beyond the first
  RingConfig ring_cfg_;                    // peers empty: no ring possible
  // The path's serves_when_idle() and name(), for enqueue() (to wake the serving thread) and
  // algorithm() on other threads.
  std::atomic<bool> path_serves_idle_{false};
  std::atomic<const char*> algorithm_{"switch"};
  std::list<std::unique_ptr<Flight>> flights_;  // admitted, in order
  std::vector<AllreduceOp*> finished_;
  uint32_t seq_ = 0;
  std::exception_ptr fatal_;            // set after a timeout or abort: the group is unusable
  std::shared_ptr<Timeline> timeline_;  // GRADSWITCH_TIMELINE; null when off

  // Queue.
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> closed_{false};
  std::mutex close_mu_;
  std::thread thread_;

  Counters counters_;
  std::array<unsigned, 64> missing_run_{};  // per rank: allreduces in a row it was missing from
};

// Parses a wire name; throws InvalidArgument for unknown names.
uint8_t parse_wire(const std::string& name);
// The element types a job joined with these options takes (bit t: gs_elem_type t): the wire, int32
// and Options::types; throws InvalidArgument for a type name it does not know.
uint32_t job_types(const Options& opt);

}  // namespace gradswitch::worker
