// A Group's background thread: queued allreduces are admitted in order into the active data path
// and stream back to back through its window (several in flight); control-plane operations run
// between them; a lost switch hands every allreduce in flight to the ring (algorithm auto).
#include <algorithm>
#include <string>

#include "common/counter.h"
#include "gradswitch/wire.h"
#include "worker/group.h"
#include "worker/log.h"

namespace gradswitch::worker {

namespace {

// Allreduces in flight at once: enough to cover DDP's buckets, few enough to bound the
// per-allreduce state (fixed32 exponents, held-sum marks).
constexpr size_t kMaxInFlight = 16;

void complete(Handle::State& st, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lk(st.mu);
    st.error = err;
    st.done = true;
  }
  st.cv.notify_all();
}

}  // namespace

void Group::thread_main() {
  for (;;) {
    std::vector<Op> admit_now;
    Op control;
    bool run_control = false, leave = false;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      for (;;) {
        while (!queue_.empty() && !queue_.front().fn && flights_.size() + admit_now.size() < kMaxInFlight) {
          admit_now.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        if (!admit_now.empty() || !flights_.empty()) break;
        if (!queue_.empty()) {  // a control-plane operation, now that nothing is in flight
          control = std::move(queue_.front());
          queue_.pop_front();
          run_control = true;
          break;
        }
        if (stopping_) {
          leave = true;
          break;
        }
        wait_for_work(lk);
      }
    }
    if (leave) break;
    if (run_control) {
      std::exception_ptr err;
      const int64_t start_ns = log_enabled(LogLevel::kDebug) ? timeline_now_ns() : 0;
      try {
        control.fn();
      } catch (...) {
        err = std::current_exception();
      }
      if (start_ns) log_operation(control, nullptr, start_ns, err);
      complete(*control.state, err);
      continue;
    }
    for (Op& op : admit_now) admit(std::move(op));
    if (flights_.empty()) continue;
    finished_.clear();
    std::exception_ptr failed;
    try {
      path_->step(&finished_);
    } catch (...) {
      failed = std::current_exception();
    }
    // Allreduces that finished before a failure are whole: they return, and only the rest go on
    // to the ring (the other ranks, which finished them too, hand the ring the same ones).
    for (AllreduceOp* ar : finished_) {
      auto it = std::find_if(flights_.begin(), flights_.end(), [&](auto& f) { return &f->ar == ar; });
      if (it == flights_.end()) continue;
      finish(**it, nullptr);
      flights_.erase(it);
    }
    if (failed) stream_failed(failed);
  }
  // A rank that finished first may hold what its peers still ask for (the ring's sums).
  if (!cancel_.load()) path_->linger(std::min(opt_.timeout_s, 1.0));
}

void Group::wait_for_work(std::unique_lock<std::mutex>& lk) {
  if (!path_->serves_when_idle()) {
    qcv_.wait(lk);
    return;
  }
  // The path works while idle (the ring answers resent partials); enqueue() and close() wake it.
  lk.unlock();
  path_->serve(100'000'000);
  lk.lock();
}

void Group::admit(Op&& op) {
  auto f = std::make_unique<Flight>();
  f->op = std::move(op);
  if (timeline_ || log_enabled(LogLevel::kDebug)) {
    f->admitted_ns = timeline_now_ns();
    f->ar.times = &f->times;
  }
  try {
    if (!prepare(*f)) return complete(*f->op.state, nullptr);  // nothing to sum
    if (path_->tracks_done()) {
      f->done.assign(f->ar.ch.chunks, 0);
      f->ar.done = &f->done;
    }
  } catch (...) {
    return finish(*f, std::current_exception());
  }
  // The switch may have ended the job while this rank was between allreduces: that fails (or hands
  // to the ring) this allreduce as a failed step would.
  if (flights_.empty()) {
    try {
      path_->resume(f->ar);
    } catch (...) {
      flights_.push_back(std::move(f));
      stream_failed(std::current_exception());
      return;
    }
  }
  try {
    path_->admit(&f->ar);  // the ring refuses float64 before sending anything
  } catch (...) {
    return finish(*f, std::current_exception());
  }
  flights_.push_back(std::move(f));
}

void Group::stream_failed(std::exception_ptr err) {
  try {
    std::rethrow_exception(err);
  } catch (const SwitchLostError& e) {
    bool ring_can = opt_.algorithm == "auto" && !ring_cfg_.peers.empty();
    for (auto& f : flights_) ring_can = ring_can && RingAllreduce::carries(f->ar.ch);
    if (ring_can) return fall_back(e.what());
  } catch (...) {
  }
  fatal_ = err;
  for (auto& f : flights_) finish(*f, err);
  flights_.clear();
}

void Group::fall_back(const std::string& why) {
  size_t held = 0, chunks = 0;
  for (auto& f : flights_) {
    held += static_cast<size_t>(std::count(f->done.begin(), f->done.end(), 1));
    chunks += f->ar.ch.chunks;
  }
  counter_add(counters_.fallback_held, held);
  const std::string from = flights_.empty() ? "its next allreduce (none was in flight)"
                                            : "allreduce seq " + std::to_string(flights_.front()->ar.seq);
  start_ring(why + " algorithm='auto': " + describe_job() + " continues on the ring among the workers from " +
             from + " on (" + std::to_string(held) + " of the " + std::to_string(chunks) +
             " chunks in flight were already summed by the switch); this group does "
             "not go back to the switch.");
  // The allreduces in flight, in order; the chunks the switch finished here count as held sums.
  for (auto& f : flights_) path_->admit(&f->ar);
}

void Group::finish(Flight& f, std::exception_ptr err) {
  if (f.admitted_ns) {
    if (timeline_) trace_allreduce(f, timeline_now_ns(), err);
    if (log_enabled(LogLevel::kDebug)) log_operation(f.op, &f, f.admitted_ns, err);
  }
  if (!err && opt_.deadline_us) {
    note_missing(f.ar);
    std::lock_guard<std::mutex> lk(f.op.state->mu);
    f.op.state->missed = f.ar.missed;
  }
  complete(*f.op.state, err);
}

// A rank missing from `straggler_report` allreduces in a row is reported, then counted afresh: one
// that stays slow is reported every `straggler_report` allreduces, never dropped from the job.
void Group::note_missing(const AllreduceOp& ar) {
  for (unsigned r = 0; r < opt_.world && r < missing_run_.size(); ++r) {
    if (!(ar.missing_ranks >> r & 1)) {
      missing_run_[r] = 0;
      continue;
    }
    if (++missing_run_[r] < opt_.straggler_report || opt_.straggler_report == 0) continue;
    missing_run_[r] = 0;
    counter_add(counters_.straggler_reports);
    log_line(LogLevel::kWarn, opt_.rank,
             describe_job() + ": rank " + std::to_string(r) + " was missing from rounds of the last " +
                 std::to_string(opt_.straggler_report) + " allreduces in a row (up to seq " +
                 std::to_string(ar.seq) + "): their sums closed at the deadline without it (deadline_us=" +
                 std::to_string(opt_.deadline_us) +
                 ", docs/protocol.md section 3.1); it straggles, or its packets are lost");
  }
}

bool Group::prepare(Flight& f) {
  const Op& req = f.op;
  const size_t count = req.count;
  const DType dtype = req.dtype;
  if (fatal_) std::rethrow_exception(fatal_);
  if (cancel_.load(std::memory_order_relaxed))
    throw Error("gradswitch: allreduce cancelled: the group of " + describe_job() + " was closed");
  const uint8_t elem =
      dtype == DType::kInt32 ? static_cast<uint8_t>(GS_ELEM_INT32) : (req.wire ? req.wire : wire_);
  if (dtype != DType::kInt32 && elem == GS_ELEM_INT32)
    throw InvalidArgument("gradswitch: " + describe_job() +
                          " uses wire int32, which carries only int32 tensors; connect with wire='float32', "
                          "'fixed32', 'float16', 'bfloat16' or 'float64' to reduce float tensors");
  const char* type_name = dtype == DType::kInt32     ? " int32"
                          : dtype == DType::kFloat64 ? " float64"
                                                     : " float32";
  if (!join_.optimizer.empty() &&
      (dtype != DType::kFloat32 || elem != GS_ELEM_FLOAT32 || count != join_.params))
    throw InvalidArgument(
        "gradswitch: " + describe_job() + " is an optimizer job (" + join_.optimizer +
        "): an allreduce takes the float32 gradient of exactly params=" + std::to_string(join_.params) +
        " elements on the float32 wire, got " + std::to_string(count) + type_name + " elements");
  if (count == 0) return false;  // consumes no sequence number (every rank does the same)
  if (count > 0xFFFFFFFFull)
    throw InvalidArgument(
        "gradswitch: an allreduce holds at most 2^32-1 elements (offsets are 32-bit), got " +
        std::to_string(count));
  AllreduceOp& op = f.ar;
  op.src = static_cast<const uint8_t*>(req.src);
  op.base = static_cast<uint8_t*>(req.data);
  op.unsummed = req.unsummed;
  op.ch = make_chunking(count, elem, join_.payload_bytes, dtype);
  // fixed32: every chunk's block exponent, and the range check, before anything is sent.
  if (elem == GS_ELEM_FIXED32) {
    block_exponents(op.ch, req.src, &f.exps);
    op.exps = &f.exps;
  }
  op.seq = seq_++;
  counter_add(counters_.allreduces);
  return true;
}

}  // namespace gradswitch::worker
