// Group: what a finished operation leaves for observers: its timeline events (timeline.h) and its
// debug log line (GRADSWITCH_LOG=debug, log.h). An allreduce's events share one async id, so that
// allreduces in flight together stay apart: the allreduce itself with its numbers, and inside it
// the round trip of its first packet, the stream of its results, and each retransmission; the
// wait in the queue before it was admitted is on a row of its own.
#include <cstdio>
#include <exception>

#include "gradswitch/wire.h"
#include "worker/group.h"
#include "worker/log.h"

namespace gradswitch::worker {

namespace {

std::string error_text(const std::exception_ptr& error) {
  if (!error) return "ok";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

int64_t micros_between(int64_t from_ns, int64_t to_ns) {
  return from_ns && to_ns ? (to_ns - from_ns) / 1000 : -1;
}

const char* dtype_name(DType d) {
  return d == DType::kInt32 ? "int32" : d == DType::kFloat64 ? "float64" : "float32";
}

// ", adaptive window 37 rounds, base rtt 812 us", or nothing without the adaptive window.
std::string window_text(const AllreduceTimes& w) {
  if (!w.window_rounds) return {};
  return ", adaptive window " + std::to_string(w.window_rounds) + " rounds, base rtt " +
         std::to_string(w.base_rtt_ns / 1000) + " us";
}

}  // namespace

void Group::trace_allreduce(const Flight& f, int64_t end_ns, const std::exception_ptr& err) {
  Timeline& t = *timeline_;
  const Op& op = f.op;
  const AllreduceTimes& w = f.times;
  const bool prepared = f.ar.ch.chunks > 0;  // else it failed its checks: no seq, nothing sent
  const std::string job = "job '" + opt_.job + "'";
  if (op.queued_ns && f.admitted_ns > op.queued_ns)
    t.span("queue: " + job, "queued", op.queued_ns, f.admitted_ns,
           JsonArgs().num("seq", prepared ? int64_t{f.ar.seq} : int64_t{-1}).text(), t.new_async_id());
  JsonArgs args;
  if (prepared) args.num("seq", uint64_t{f.ar.seq});
  args.num("elements", uint64_t{op.count})
      .num("bytes", uint64_t{op.count * (op.dtype == DType::kFloat64 ? 8u : 4u)})
      .str("dtype", dtype_name(op.dtype));
  if (prepared) args.str("wire", gs_elem_name(f.ar.ch.elem)).num("chunks", uint64_t{f.ar.ch.chunks});
  args.str("algorithm", algorithm())
      .num("retransmissions", w.retransmissions)
      .num("queued_us", micros_between(op.queued_ns, f.admitted_ns))
      .num("first_result_us", micros_between(w.first_send_ns, w.first_result_ns))
      .str("status", error_text(err));
  if (w.window_rounds)
    args.num("window_rounds", uint64_t{w.window_rounds}).num("base_rtt_us", w.base_rtt_ns / 1000);
  if (opt_.deadline_us)  // bounded-time rounds (docs/protocol.md §3.1): what its rounds lacked
    args.num("missed", f.ar.missed).num("missing_ranks", f.ar.missing_ranks);
  const std::string lane = "allreduce: " + job;
  const int64_t id = t.new_async_id();
  t.span(lane, "allreduce", f.admitted_ns, end_ns, args.text(), id);
  if (w.first_send_ns && w.first_result_ns)
    t.span(lane, "first packet to first result", w.first_send_ns, w.first_result_ns, "", id);
  if (w.first_result_ns && w.last_result_ns > w.first_result_ns)
    t.span(lane, "results", w.first_result_ns, w.last_result_ns, "", id);
  for (const AllreduceTimes::Retx& r : w.retx)
    t.instant(lane, "retransmit", r.at_ns,
              JsonArgs().num("slot", uint64_t{r.slot}).num("chunk", uint64_t{r.chunk}).text(), id);
}

void Group::log_operation(const Op& op, const Flight* f, int64_t start_ns, const std::exception_ptr& err) {
  char took[32];
  std::snprintf(took, sizeof took, "%.3f ms", static_cast<double>(timeline_now_ns() - start_ns) / 1e6);
  std::string what =
      !f ? std::string("control request")
         : "allreduce of " + std::to_string(op.count) + " " + dtype_name(op.dtype) + " elements";
  if (f && f->ar.ch.chunks > 0)
    what += " (seq " + std::to_string(f->ar.seq) + ", " + std::to_string(f->ar.ch.chunks) + " chunks of " +
            gs_elem_name(f->ar.ch.elem) + ", " + algorithm() + ", " +
            std::to_string(f->times.retransmissions) + " retransmission(s)" + window_text(f->times) + ")";
  log_line(LogLevel::kDebug, opt_.rank,
           describe_job() + ": " + what + " " + (err ? "failed" : "done") + " in " + took +
               (err ? ": " + error_text(err) : std::string()));
}

}  // namespace gradswitch::worker
