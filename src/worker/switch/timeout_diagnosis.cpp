// The diagnosis of an allreduce timeout through the switch (see timeout_diagnosis.h).
#include "worker/switch/timeout_diagnosis.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common/seq.h"
#include "gradswitch/control.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"
#include "worker/switch/switch_notice.h"

namespace gradswitch::worker {

namespace {

std::string fmt_s(double s) {
  std::ostringstream o;
  o.precision(3);
  o << s;
  return o.str();
}

std::string join_ranks(const std::vector<unsigned>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::vector<long long> parse_list(const std::string& s) {
  std::vector<long long> out;
  std::stringstream in(s);
  std::string tok;
  while (std::getline(in, tok, ','))
    if (!tok.empty()) {
      try {
        out.push_back(std::stoll(tok));
      } catch (...) {
      }
    }
  return out;
}

// What every diagnosis of one stuck round says: where it waits, and what to check.
struct Diagnosis {
  const PathContext& ctx;
  const StuckRound& stuck;
  std::string endpoint;  // the control connection's host:port
  std::string ports;     // the switch's UDP data ports
  std::string head;      // the timeout and the round it waits on
  std::string check;     // what to check when ranks are missing

  std::string switch_host() const { return endpoint.substr(0, endpoint.rfind(':')); }
};

Diagnosis describe(const PathContext& ctx, ControlClient* control, const StuckRound& stuck) {
  const JoinInfo& join = *ctx.join;
  Diagnosis d{ctx, stuck, control ? control->endpoint() : std::string("(no control connection)"), "", "", ""};
  const std::string where =
      "slot " + std::to_string(stuck.slot) + " version " +
      std::to_string(static_cast<unsigned>(stuck.version)) +
      (stuck.bootstrap ? " (fixed32 exponent round for elements starting at " : " (elements starting at ") +
      std::to_string(stuck.offset) + ")";
  d.ports = "UDP data ports " + std::to_string(join.data_port) +
            (join.threads > 1 ? "-" + std::to_string(join.data_port + join.threads - 1) : "");
  d.head = "gradswitch: allreduce timed out: " + ctx.job_text + ", allreduce seq " +
           std::to_string(stuck.seq) + " made no progress for " + fmt_s(ctx.opt->timeout_s) +
           " s; waiting on " + where + ". ";
  d.check =
      "Check that the missing ranks' processes are alive and make the same sequence of allreduce "
      "calls with the same sizes, that every worker reaches the switch at " +
      d.endpoint + " (" + d.ports + "), and that no firewall or MTU limit drops UDP datagrams of up to " +
      std::to_string(GS_HEADER_BYTES + join.payload_bytes) + " bytes.";
  return d;
}

// The switch aborted the job: the error the abort is (its reason and rank, as an ABORT would say).
void throw_if_aborted(const Diagnosis& d, const Reply& r, ControlClient* control) {
  if (r.get(GS_KEY_STATE) != GS_STATE_ABORTED) return;
  // abort_reason is a name (rank_left, ...), abort_rank a rank or "-".
  const uint8_t reason = gs_abort_reason_from_name(r.get(GS_KEY_ABORT_REASON).c_str());
  uint16_t rank = GS_RANK_ALL;
  try {
    rank = static_cast<uint16_t>(r.get_int(GS_KEY_ABORT_RANK));
  } catch (const Error&) {
  }
  std::string msg = "gradswitch: " + d.ctx.job_text + " was aborted by the switch during allreduce seq " +
                    std::to_string(d.stuck.seq) + ": " + describe_abort(reason, rank, r.kv, d.ctx, nullptr);
  throw_abort(reason, rank, r.kv, msg, control->endpoint());
}

// The switch's slot holds this round: the ranks it lacks, or, with none missing, results that do not
// reach this worker.
[[noreturn]] void throw_open_round(const Diagnosis& d, const Reply& r) {
  std::vector<unsigned> missing, present;
  uint64_t mask = 0;
  for (long long s : parse_list(r.get(GS_KEY_SEEN)))
    if (s >= 0 && s < 64) mask |= uint64_t{1} << s;
  for (unsigned k = 0; k < d.ctx.opt->world; ++k) ((mask >> k) & 1 ? present : missing).push_back(k);
  if (!missing.empty())
    throw TimeoutError(d.head + "Rank(s) " + join_ranks(missing) + " have not contributed (received from " +
                       (present.empty() ? std::string("none") : join_ranks(present)) + "). " + d.check);
  // Results from another address than the one this worker sends to are dropped (docs/protocol.md
  // §2.1): a switch host that answers from another of its addresses looks like lost results.
  const uint64_t foreign = d.ctx.counters ? d.ctx.counters->dropped_foreign.load() : 0;
  throw TimeoutError(
      d.head +
      "Every rank contributed to this round at the switch, but its result does not reach "
      "this worker: check that UDP datagrams from the switch reach port " +
      std::to_string(d.ctx.transport->local_port()) + " on this host (firewall, NAT, MTU)." +
      (foreign ? " " + std::to_string(foreign) +
                     " datagram(s) from other addresses than the switch's data ports at " + d.switch_host() +
                     " were dropped (stats dropped_foreign): does the switch answer from another "
                     "of its addresses? Give gradswitchd --control-host the address workers "
                     "connect to."
               : std::string()));
}

// The switch holds no part of this round: the ranks that have not reached this allreduce, this one
// first, or else a slot that holds another round.
[[noreturn]] void throw_unreached_round(const Diagnosis& d, const Reply& r) {
  const std::vector<long long> rank_seq = parse_list(r.get(GS_KEY_RANK_SEQ));
  std::vector<unsigned> missing;
  for (unsigned k = 0; k < d.ctx.opt->world && k < rank_seq.size(); ++k) {
    const long long v = rank_seq[k];
    if (!(v >= 0 && seq_at_or_after(static_cast<uint32_t>(v), d.stuck.seq))) missing.push_back(k);
  }
  if (std::find(missing.begin(), missing.end(), d.ctx.opt->rank) != missing.end())
    throw TimeoutError(d.head +
                       "The switch has received nothing from this rank for this allreduce: check that UDP "
                       "datagrams from this host reach the switch at " +
                       d.switch_host() + " (" + d.ports + "; firewall, MTU).");
  if (!missing.empty())
    throw TimeoutError(d.head + "Rank(s) " + join_ranks(missing) + " have not reached allreduce seq " +
                       std::to_string(d.stuck.seq) + ". " + d.check);
  throw TimeoutError(d.head + "The switch's slot holds another round (" + r.get(GS_KEY_SLOT_STATE) + " seq " +
                     r.get(GS_KEY_SLOT_SEQ) + " offset " + r.get(GS_KEY_SLOT_OFFSET) +
                     "): the ranks disagree on the sequence or sizes of their allreduce calls? " + d.check);
}

}  // namespace

void throw_switch_timeout(const PathContext& ctx, ControlClient* control, const StuckRound& stuck) {
  const Diagnosis d = describe(ctx, control, stuck);
  if (!control) throw TimeoutError(d.head + d.check);
  Reply r;
  try {
    r = parse_reply(control->request(GS_VERB_STATUS " " GS_KEY_JOB_ID "=" + std::to_string(ctx.join->job_id) +
                                         " " GS_KEY_SLOT "=" + std::to_string(stuck.slot) +
                                         " " GS_KEY_VERSION "=" +
                                         std::to_string(static_cast<unsigned>(stuck.version)),
                                     5.0));
  } catch (const Error& e) {
    throw TimeoutError(d.head + "The switch did not answer STATUS either (" + e.what() +
                       "): is gradswitchd still running at " + d.endpoint + "?");
  }
  if (!r.ok) throw TimeoutError(d.head + "STATUS failed: " + r.code + " " + r.message + ". " + d.check);
  throw_if_aborted(d, r, control);
  const std::string state = r.get(GS_KEY_SLOT_STATE);
  const bool same_round = r.get(GS_KEY_SLOT_SEQ) == std::to_string(stuck.seq) &&
                          r.get(GS_KEY_SLOT_OFFSET) == std::to_string(stuck.offset);
  if (same_round && (state == "open" || state == "complete")) throw_open_round(d, r);
  throw_unreached_round(d, r);
}

}  // namespace gradswitch::worker
