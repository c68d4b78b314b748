// Abort reasons and the switch going away, turned into errors (see switch_notice.h).
#include "worker/switch/switch_notice.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "gradswitch/control.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"

namespace gradswitch::worker {

namespace {

std::vector<std::string> split_pair(const std::map<std::string, std::string>& kv, const std::string& key) {
  std::vector<std::string> out;
  auto it = kv.find(key);
  if (it == kv.end()) return out;
  std::stringstream in(it->second);
  std::string tok;
  while (std::getline(in, tok, ',')) out.push_back(tok);
  return out;
}

long long number(const std::string& s, long long dflt) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  return s.empty() || *end ? dflt : v;
}

bool lists_rank(const std::map<std::string, std::string>& kv, const std::string& key, uint16_t rank) {
  for (const std::string& r : split_pair(kv, key))
    if (number(r, -1) == rank) return true;
  return false;
}

uint8_t elem_of(const std::string& name) {
  for (uint8_t t = 1; t < 16; ++t)
    if (name == gs_elem_name(t)) return t;
  return 0;
}

// How long a tensor is, from one of its contributions to a round at `offset`: a chunk with LAST
// ends it; a fixed32 exponent round (count 0) announces the chunk at `offset`.
std::string extent(bool last, long long count, long long offset, long long per_packet) {
  if (count > 0)
    return last ? std::to_string(offset + count) + " elements"
                : "more than " + std::to_string(offset + count) + " elements";
  return last ? std::to_string(offset + 1) + " to " + std::to_string(offset + per_packet) + " elements"
              : "more than " + std::to_string(offset + per_packet) + " elements";
}

std::string mismatch_text(const std::map<std::string, std::string>& kv, const PathContext& ctx,
                          const AllreduceOp* op) {
  auto ranks = split_pair(kv, GS_KEY_MISMATCH_RANKS), counts = split_pair(kv, GS_KEY_MISMATCH_COUNTS),
       last = split_pair(kv, GS_KEY_MISMATCH_LAST), types = split_pair(kv, GS_KEY_MISMATCH_TYPES),
       scales = split_pair(kv, GS_KEY_MISMATCH_SCALES);
  const std::string tail =
      " Every rank must make the same sequence of allreduce calls, with tensors of the same length and "
      "dtype.";
  std::string own;
  if (op)
    own = " This rank passed " + std::to_string(op->ch.count) + " elements (" + gs_elem_name(op->ch.elem) +
          " on the wire).";
  if (ranks.size() != 2 || counts.size() != 2 || last.size() != 2 || types.size() != 2 || scales.size() != 2)
    return "the ranks' contributions to one round differ in length or type." + own + tail;
  if (number(ranks[0], 0) > number(ranks[1], 0))  // in rank order
    for (auto* v : {&ranks, &counts, &last, &types, &scales}) std::swap((*v)[0], (*v)[1]);
  const std::string seq = kv.count(GS_KEY_MISMATCH_SEQ) ? kv.at(GS_KEY_MISMATCH_SEQ) : "?";
  const long long offset = number(kv.count(GS_KEY_MISMATCH_OFFSET) ? kv.at(GS_KEY_MISMATCH_OFFSET) : "", 0);
  const std::string a = "rank " + ranks[0], b = "rank " + ranks[1];
  std::string what;
  if (types[0] != types[1]) {
    what = a + " sends " + types[0] + " elements, " + b + " " + types[1] +
           " (an int32 tensor on one rank and a float tensor on the other?)";
  } else if (counts[0] != counts[1] || last[0] != last[1]) {
    const auto per = static_cast<long long>(gs_max_count(elem_of(types[0]), ctx.join->payload_bytes));
    what = a + " passed " + extent(last[0] == "1", number(counts[0], 0), offset, per) + ", " + b + " " +
           extent(last[1] == "1", number(counts[1], 0), offset, per);
  } else {
    what = a + " quantised with fixed32 scale " + scales[0] + ", " + b + " with " + scales[1] +
           " (the ranks disagree on the job's exponents)";
  }
  return "the ranks disagree on allreduce seq " + seq + ": " + what + " (seen in the chunk at element " +
         std::to_string(offset) + ")." + own + tail;
}

std::string get(const std::map<std::string, std::string>& kv, const char* key) {
  auto it = kv.find(key);
  return it == kv.end() ? std::string() : it->second;
}

// Nothing more goes through the switch (its ranks may take another path, such as the ring): it is
// stopping or gone, or the spine behind a leaf is.
bool switch_gone(uint8_t reason, const std::map<std::string, std::string>& kv) {
  const std::string spine = get(kv, GS_KEY_UPLINK_REASON);
  return reason == GS_ABORT_SHUTDOWN ||
         (reason == GS_ABORT_UPLINK &&
          (spine == GS_UPLINK_LOST || spine == gs_abort_reason_name(GS_ABORT_SHUTDOWN)));
}

}  // namespace

std::string abort_reason_text(uint8_t reason, uint16_t rank) {
  switch (reason) {
    case GS_ABORT_RANK_LEFT:
      return "rank " + std::to_string(rank) +
             " left the job (it closed its group, or its process exited or crashed)";
    case GS_ABORT_IDLE:
      return "the job was idle past the switch's idle timeout (--idle-timeout)";
    case GS_ABORT_SHUTDOWN:
      return "the switch is shutting down";
    case GS_ABORT_OPERATOR:
      return "the job was ended through the switch's control plane";
    case GS_ABORT_MISMATCH:
      return "the ranks disagree on an allreduce (tensors of different lengths or dtypes)";
    case GS_ABORT_UPLINK:
      return "the spine switch behind this rank's leaf switch ended the job or was lost";
    default:
      return "abort reason " + std::to_string(reason) +
             (rank == GS_RANK_ALL ? std::string() : " (rank " + std::to_string(rank) + ")");
  }
}

std::string describe_abort(uint8_t reason, uint16_t rank, const std::map<std::string, std::string>& kv,
                           const PathContext& ctx, const AllreduceOp* op) {
  if (reason == GS_ABORT_MISMATCH) return mismatch_text(kv, ctx, op);
  if (reason == GS_ABORT_UPLINK && kv.count(GS_KEY_UPLINK_REASON)) {
    // Two levels (docs/protocol.md section 8): say what happened at the spine, in its own words.
    const std::string spine = "the spine switch at " + get(kv, GS_KEY_UPLINK) +
                              " (which this rank's leaf switch " + "aggregates through)";
    const std::string why = get(kv, GS_KEY_UPLINK_REASON);
    if (why == GS_UPLINK_LOST)
      return spine + " was lost: its control connection to the leaf closed (did it stop or crash?)";
    const long long r = number(get(kv, GS_KEY_UPLINK_RANK), GS_RANK_ALL);
    const uint16_t at = r >= 0 && r < GS_RANK_ALL ? static_cast<uint16_t>(r) : GS_RANK_ALL;
    if (why == "rank_left")
      return spine + " ended the job: rank " + std::to_string(at) + " left it there (rank " +
             std::to_string(at) + ", or the leaf switch it joined through, closed, stopped or crashed)";
    std::map<std::string, std::string> spine_kv = kv;  // the spine's mismatch_* keys, if any
    spine_kv.erase(GS_KEY_LEFT);                       // the leaf's, not the spine's
    return spine +
           " ended the job: " + describe_abort(gs_abort_reason_from_name(why.c_str()), at, spine_kv, ctx, op);
  }
  if (reason == GS_ABORT_RANK_LEFT && !get(kv, GS_KEY_LOST).empty())
    return "rank " + std::to_string(rank) + " left the job because it lost the switch at " +
           get(kv, GS_KEY_LOST) + ", another switch of this job (it closed rank " + std::to_string(rank) +
           "'s control connection or announced its shutdown: did gradswitchd there stop or crash?)";
  if (reason == GS_ABORT_RANK_LEFT && kv.count(GS_KEY_LEFT)) {
    if (lists_rank(kv, GS_KEY_LEFT, rank))
      return "rank " + std::to_string(rank) +
             " left the job (it closed its group) while this rank still had allreduces to run: every rank "
             "must make the same allreduce calls before it closes";
    return "rank " + std::to_string(rank) +
           " left the job: its control connection to the switch closed (did that process exit or crash?)";
  }
  return abort_reason_text(reason, rank);
}

void throw_abort(uint8_t reason, uint16_t rank, const std::map<std::string, std::string>& kv,
                 const std::string& msg, const std::string& at) {
  if (switch_gone(reason, kv))
    throw SwitchLostError(msg, reason, rank, reason == GS_ABORT_SHUTDOWN ? at : "");
  if (reason == GS_ABORT_RANK_LEFT && !get(kv, GS_KEY_LOST).empty())
    throw SwitchLostError(msg, reason, rank, get(kv, GS_KEY_LOST));
  throw AbortedError(msg, reason, rank);
}

void throw_notice(const PathContext& ctx, const ControlClient& control, const SwitchNotice& n,
                  const AllreduceOp& op, bool started) {
  const std::string when = (started ? " during allreduce seq " : " before allreduce seq ") +
                           std::to_string(op.seq) + (started ? "" : " (between two allreduces)");
  if (n.kind == SwitchNotice::Kind::kClosed)
    throw SwitchLostError("gradswitch: the switch at " + control.endpoint() +
                              " closed the control connection of " + ctx.job_text + when +
                              ": did gradswitchd stop or crash?",
                          GS_ABORT_SHUTDOWN, GS_RANK_ALL, control.endpoint());
  const uint8_t reason = gs_abort_reason_from_name(get(n.kv, GS_KEY_REASON).c_str());
  const long long r = number(get(n.kv, GS_KEY_RANK), GS_RANK_ALL);
  const uint16_t rank = r >= 0 && r < GS_RANK_ALL ? static_cast<uint16_t>(r) : GS_RANK_ALL;
  throw_abort(reason, rank, n.kv,
              "gradswitch: " + ctx.job_text + " was aborted by the switch" + when + ": " +
                  describe_abort(reason, rank, n.kv, ctx, &op),
              control.endpoint());
}

void throw_idle_notice(const PathContext& ctx, ControlClient* control, const AllreduceOp& next) {
  if (!control) return;
  if (SwitchNotice n = control->poll_notice()) throw_notice(ctx, *control, n, next, /*started=*/false);
}

void throw_lost_elsewhere(const PathContext& ctx, const ControlClient& control, const SwitchLostError& seen,
                          const AllreduceOp& op) {
  const std::string who = seen.rank() == GS_RANK_ALL ? "another rank" : "rank " + std::to_string(seen.rank());
  throw SwitchLostError("gradswitch: the switch at " + control.endpoint() + " is gone for " + ctx.job_text +
                            " during allreduce seq " + std::to_string(op.seq) + ": " + who +
                            " lost it first (it closed that rank's control connection or announced its "
                            "shutdown) and left the job at the job's other switches: did gradswitchd at " +
                            control.endpoint() + " stop or crash?",
                        seen.reason(), seen.rank(), control.endpoint());
}

void confirm_abort(const PathContext& ctx, ControlClient* control, uint8_t reason, uint16_t rank,
                   const AllreduceOp& op, double timeout_s) {
  const std::string head = "gradswitch: " + ctx.job_text +
                           " was aborted by the switch during allreduce seq " + std::to_string(op.seq) + ": ";
  if (!control) throw_abort(reason, rank, {}, head + describe_abort(reason, rank, {}, ctx, &op), "");
  if (SwitchNotice n = control->poll_notice()) throw_notice(ctx, *control, n, op, /*started=*/true);
  Reply r;
  try {
    r = parse_reply(control->request(GS_VERB_STATUS, timeout_s));
  } catch (const Error&) {  // no answer in time, or the connection broke: its notice tells which
  }
  // EVENT lines that came while the reply was awaited were kept; a closed connection shows here too.
  if (SwitchNotice n = control->poll_notice()) throw_notice(ctx, *control, n, op, /*started=*/true);
  if (!r.ok || r.get(GS_KEY_STATE) != GS_STATE_ABORTED) return;
  const uint8_t why = gs_abort_reason_from_name(r.get(GS_KEY_ABORT_REASON).c_str());
  const long long at = number(r.get(GS_KEY_ABORT_RANK), GS_RANK_ALL);
  const uint16_t who = at >= 0 && at < GS_RANK_ALL ? static_cast<uint16_t>(at) : GS_RANK_ALL;
  throw_abort(why, who, r.kv, head + describe_abort(why, who, r.kv, ctx, &op), control->endpoint());
}

}  // namespace gradswitch::worker
