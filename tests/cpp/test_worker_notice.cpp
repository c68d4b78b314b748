// What the switch says beside results, as the worker reads it: EVENT lines and a closed control
// connection (ControlClient::poll_notice against a scripted TCP peer), abort texts built from the
// switch's keys, and a timeout whose STATUS says the job was aborted.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "gradswitch/control.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "scripted_peer.h"
#include "worker/control.h"
#include "worker/errors.h"
#include "worker/switch/switch_notice.h"
#include "worker/switch/timeout_diagnosis.h"

using namespace gradswitch;
using namespace gradswitch::worker;

namespace {

SwitchNotice wait_notice(ControlClient& c) {
  for (int i = 0; i < 200; ++i) {
    if (SwitchNotice n = c.poll_notice()) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

struct Context {
  Options opt;
  JoinInfo join;
  PathContext ctx;
  Context() {
    opt.rank = 0;
    opt.world = 2;
    join.payload_bytes = 1440;
    join.job_id = 9;
    ctx.opt = &opt;
    ctx.join = &join;
    ctx.job_text = "job 't' (job_id 9, rank 0 of 2)";
  }
};

}  // namespace

TEST(event_lines_are_notices_and_replies_skip_them) {
  ScriptedPeer sw("EVENT aborted job_id=9 reason=rank_left rank=1 left=1\n", "OK\n");
  ControlClient c("127.0.0.1", sw.port(), 2.0);
  // A request's reply is found behind the EVENT line, which stays for poll_notice.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(c.request("PING", 2.0) == "OK");
  SwitchNotice n = c.poll_notice();
  CHECK(n.kind == SwitchNotice::Kind::kAborted);
  CHECK(n.kv["reason"] == "rank_left" && n.kv["rank"] == "1" && n.kv["left"] == "1");
  CHECK(!c.poll_notice());
}

TEST(a_closed_connection_is_a_notice_for_good) {
  ScriptedPeer sw("", "", /*close_after_ms=*/0);
  ControlClient c("127.0.0.1", sw.port(), 2.0);
  CHECK(wait_notice(c).kind == SwitchNotice::Kind::kClosed);
  CHECK(c.poll_notice().kind == SwitchNotice::Kind::kClosed);
}

TEST(abort_texts_say_who_and_why) {
  Context t;
  CHECK(gs_abort_reason_from_name("rank_left") == GS_ABORT_RANK_LEFT &&
        gs_abort_reason_from_name("mismatch") == GS_ABORT_MISMATCH);
  CHECK(gs_abort_reason_from_name("bogus") == 0 && gs_abort_reason_from_name("none") == 0);
  for (uint8_t r = GS_ABORT_RANK_LEFT; r <= GS_ABORT_MISMATCH; ++r)
    CHECK(gs_abort_reason_from_name(gs_abort_reason_name(r)) == r);
  std::map<std::string, std::string> kv{{"left", "1"}};
  CHECK(describe_abort(GS_ABORT_RANK_LEFT, 1, kv, t.ctx, nullptr).find("closed its group") !=
        std::string::npos);
  kv["left"] = "";
  CHECK(describe_abort(GS_ABORT_RANK_LEFT, 1, kv, t.ctx, nullptr).find("exit or crash") != std::string::npos);
  std::map<std::string, std::string> m{{"mismatch_seq", "4"},     {"mismatch_offset", "720"},
                                       {"mismatch_ranks", "1,0"}, {"mismatch_counts", "360,280"},
                                       {"mismatch_last", "0,1"},  {"mismatch_types", "float32,float32"},
                                       {"mismatch_scales", "0,0"}};
  std::string s = describe_abort(GS_ABORT_MISMATCH, 0, m, t.ctx, nullptr);
  CHECK(s.find("rank 0 passed 1000 elements, rank 1 more than 1080 elements") != std::string::npos);
  CHECK(s.find("allreduce seq 4") != std::string::npos);
}

TEST(a_rank_that_left_for_a_lost_switch_makes_every_rank_lose_it) {
  // EVENT aborted ... lost=: rank 1 left because another switch of the job went away.
  Context t;
  std::map<std::string, std::string> kv{{"left", "1"}, {"lost", "10.0.0.7:7700"}};
  const std::string text = describe_abort(GS_ABORT_RANK_LEFT, 1, kv, t.ctx, nullptr);
  CHECK(text.find("rank 1 left the job because it lost the switch at 10.0.0.7:7700") != std::string::npos);
  bool thrown = false;
  try {
    throw_abort(GS_ABORT_RANK_LEFT, 1, kv, text, "10.0.0.1:7700");
  } catch (const SwitchLostError& e) {
    thrown = true;
    CHECK(e.lost() == "10.0.0.7:7700" && e.rank() == 1);
  }
  CHECK(thrown);
  // Without lost= it stays an abort (rank 1 closed its group early); a shutdown loses this switch.
  kv.erase("lost");
  try {
    throw_abort(GS_ABORT_RANK_LEFT, 1, kv, "m", "10.0.0.1:7700");
  } catch (const SwitchLostError&) {
    CHECK(false);
  } catch (const AbortedError& e) {
    CHECK(e.reason() == GS_ABORT_RANK_LEFT);
  }
  try {
    throw_abort(GS_ABORT_SHUTDOWN, GS_RANK_ALL, {}, "m", "10.0.0.1:7700");
  } catch (const SwitchLostError& e) {
    CHECK(e.lost() == "10.0.0.1:7700");
  }
}

TEST(a_timeout_on_an_aborted_job_names_the_abort_reason) {
  // The switch's STATUS says aborted, rank_left by rank 1 (not a number: a name and a rank).
  ScriptedPeer sw("",
                  "OK job_id=9 name=t world=2 state=aborted abort_reason=rank_left abort_rank=1 left= "
                  "idle_ms=3 rank_seq=0,0\n");
  ControlClient c("127.0.0.1", sw.port(), 2.0);
  Context t;
  StuckRound stuck;
  bool thrown = false;
  try {
    throw_switch_timeout(t.ctx, &c, stuck);
  } catch (const AbortedError& e) {
    thrown = true;
    CHECK(e.reason() == GS_ABORT_RANK_LEFT && e.rank() == 1);
    CHECK(std::string(e.what()).find("rank 1 left the job") != std::string::npos);
    CHECK(std::string(e.what()).find("abort reason 0") == std::string::npos);
  }
  CHECK(thrown);
}

GS_TEST_MAIN()
