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

}  // namespace

void throw_switch_timeout(const PathContext& ctx, ControlClient* control, const StuckRound& stuck) {
  const Options& opt = *ctx.opt;
  const JoinInfo& join = *ctx.join;
  const unsigned slot = stuck.slot;
  std::string where =
      "slot " + std::to_string(slot) + " version " + std::to_string(static_cast<unsigned>(stuck.version)) +
      (stuck.bootstrap ? " (fixed32 exponent round for elements starting at " : " (elements starting at ") +
      std::to_string(stuck.offset) + ")";
  std::string endpoint = control ? control->endpoint() : std::string("(no control connection)");
  std::string ports = "UDP data ports " + std::to_string(join.data_port) +
                      (join.threads > 1 ? "-" + std::to_string(join.data_port + join.threads - 1) : "");
  std::string head = "gradswitch: allreduce timed out: " + ctx.job_text + ", allreduce seq " +
                     std::to_string(stuck.seq) + " made no progress for " + fmt_s(opt.timeout_s) +
                     " s; waiting on " + where + ". ";
  std::string check =
      "Check that the missing ranks' processes are alive and make the same sequence of allreduce "
      "calls with the same sizes, that every worker reaches the switch at " +
      endpoint + " (" + ports + "), and that no firewall or MTU limit drops UDP datagrams of up to " +
      std::to_string(GS_HEADER_BYTES + join.payload_bytes) + " bytes.";
  if (!control) throw TimeoutError(head + check);

  Reply r;
  try {
    r = parse_reply(control->request(GS_VERB_STATUS " " GS_KEY_JOB_ID "=" + std::to_string(join.job_id) +
                                         " " GS_KEY_SLOT "=" + std::to_string(slot) + " " GS_KEY_VERSION "=" +
                                         std::to_string(static_cast<unsigned>(stuck.version)),
                                     5.0));
  } catch (const Error& e) {
    throw TimeoutError(head + "The switch did not answer STATUS either (" + e.what() +
                       "): is gradswitchd still running at " + endpoint + "?");
  }
  if (!r.ok) throw TimeoutError(head + "STATUS failed: " + r.code + " " + r.message + ". " + check);
  if (r.get(GS_KEY_STATE) == GS_STATE_ABORTED) {
    // abort_reason is a name (rank_left, ...), abort_rank a rank or "-".
    const uint8_t reason = gs_abort_reason_from_name(r.get(GS_KEY_ABORT_REASON).c_str());
    uint16_t rank = GS_RANK_ALL;
    try {
      rank = static_cast<uint16_t>(r.get_int(GS_KEY_ABORT_RANK));
    } catch (const Error&) {
    }
    std::string msg = "gradswitch: " + ctx.job_text + " was aborted by the switch during allreduce seq " +
                      std::to_string(stuck.seq) + ": " + describe_abort(reason, rank, r.kv, ctx, nullptr);
    throw_abort(reason, rank, r.kv, msg, control ? control->endpoint() : std::string());
  }
  std::vector<long long> seen = parse_list(r.get(GS_KEY_SEEN));
  std::vector<long long> rank_seq = parse_list(r.get(GS_KEY_RANK_SEQ));
  bool same_round = r.get(GS_KEY_SLOT_SEQ) == std::to_string(stuck.seq) &&
                    r.get(GS_KEY_SLOT_OFFSET) == std::to_string(stuck.offset);
  std::string state = r.get(GS_KEY_SLOT_STATE);
  std::vector<unsigned> missing, present;
  if (same_round && (state == "open" || state == "complete")) {
    uint64_t mask = 0;
    for (long long s : seen)
      if (s >= 0 && s < 64) mask |= uint64_t{1} << s;
    for (unsigned k = 0; k < opt.world; ++k) ((mask >> k) & 1 ? present : missing).push_back(k);
    if (missing.empty()) {
      // Results from another address than the one this worker sends to are dropped (docs/protocol.md
      // §2.1): a switch host that answers from another of its addresses looks like lost results.
      const uint64_t foreign = ctx.counters ? ctx.counters->dropped_foreign.load() : 0;
      throw TimeoutError(
          head +
          "Every rank contributed to this round at the switch, but its result does not reach "
          "this worker: check that UDP datagrams from the switch reach port " +
          std::to_string(ctx.transport->local_port()) + " on this host (firewall, NAT, MTU)." +
          (foreign ? " " + std::to_string(foreign) +
                         " datagram(s) from other addresses than the switch's data ports at " +
                         endpoint.substr(0, endpoint.rfind(':')) +
                         " were dropped (stats dropped_foreign): does the switch answer from another of its "
                         "addresses? Give gradswitchd --control-host the address workers connect to."
                   : std::string()));
    }
    throw TimeoutError(head + "Rank(s) " + join_ranks(missing) + " have not contributed (received from " +
                       (present.empty() ? std::string("none") : join_ranks(present)) + "). " + check);
  }
  // The switch holds no part of this round: find the ranks that have not reached this allreduce.
  for (unsigned k = 0; k < opt.world && k < rank_seq.size(); ++k) {
    long long v = rank_seq[k];
    bool reached = v >= 0 && seq_at_or_after(static_cast<uint32_t>(v), stuck.seq);
    if (!reached) missing.push_back(k);
  }
  bool self_missing = std::find(missing.begin(), missing.end(), opt.rank) != missing.end();
  if (self_missing)
    throw TimeoutError(head +
                       "The switch has received nothing from this rank for this allreduce: check that UDP "
                       "datagrams from this host reach the switch at " +
                       endpoint.substr(0, endpoint.rfind(':')) + " (" + ports + "; firewall, MTU).");
  if (!missing.empty())
    throw TimeoutError(head + "Rank(s) " + join_ranks(missing) + " have not reached allreduce seq " +
                       std::to_string(stuck.seq) + ". " + check);
  throw TimeoutError(head + "The switch's slot holds another round (" + r.get(GS_KEY_SLOT_STATE) + " seq " +
                     r.get(GS_KEY_SLOT_SEQ) + " offset " + r.get(GS_KEY_SLOT_OFFSET) +
                     "): the ranks disagree on the sequence "
                     "or sizes of their allreduce calls? " +
                     check);
}

}  // namespace gradswitch::worker
