// The allreduce through the switch (docs/protocol.md section 4): tensors stream through the job's
// slot pool, one chunk per round, each slot reused as soon as its result arrives, successive
// allreduces back to back (stream_schedule.h), at most as many rounds in flight as the
// WindowController allows (the pool is the cap; the oldest chunk without a result always goes).
// Lost rounds are found by the LossDetectors (one per switch thread: each thread's results keep
// their order, threads' results do not) and resent, and the switch's DSACK answers, or an original
// result that arrives after the answer to its resend, undo what a spurious resend taught them;
// fixed32 agrees block exponents through the same rounds (section 5).
#pragma once

#include <cstdint>
#include <exception>
#include <vector>

#include "common/loss_detector.h"
#include "common/rng.h"
#include "worker/control.h"
#include "worker/path.h"
#include "worker/stream_schedule.h"
#include "worker/switch/concede_policy.h"
#include "worker/switch/switch_notice.h"
#include "worker/switch/window_controller.h"
#include "worker/window.h"

namespace gradswitch::worker {

class SwitchAllreduce : public DataPath {
 public:
  // `control` (may be null in tests) tells of aborts and answers STATUS when an allreduce times out.
  SwitchAllreduce(const PathContext& ctx, ControlClient* control);

  const char* name() const override { return "switch"; }
  void admit(AllreduceOp* op) override;
  // Throws TimeoutError / AbortedError / SwitchLostError / Error.
  void step(std::vector<AllreduceOp*>* finished) override;
  bool idle() const override { return schedule_.empty(); }
  // The ring (algorithm auto) finishes what a lost switch left: the chunks that arrived count.
  bool tracks_done() const override { return true; }
  // An abort or a closed connection the control connection brought while no allreduce ran.
  void resume(const AllreduceOp& next) override { throw_idle_notice(ctx_, control_, next); }

  // For a caller that shares the transport with other switches (sharding, sharded_allreduce.h)
  // and receives for all of them: whether a datagram is this switch's job's; handles datagrams of
  // this job, returning a SwitchLostError met on the way (an ABORT for the switch's shutdown)
  // instead of throwing it, so that the results behind it are taken too, and queuing the rounds
  // they start; then looks at that error, the control connection, the timers and the timeout
  // (`quiet`: nothing was received), sends what is queued, throws or returns how long the caller
  // may wait. step() is these on its own transport (which service() then drains of the results
  // still on their way from a switch that went). A caller that skips service() for an idle path
  // sends its queue with send_queued().
  bool owns(const uint8_t* p, uint32_t len) const;
  void check_cancel() const;
  std::exception_ptr take(const InPacket* in, size_t n, int64_t now, std::vector<AllreduceOp*>* finished);
  int64_t service(int64_t now, bool quiet, std::exception_ptr lost, bool own_transport,
                  std::vector<AllreduceOp*>* finished);
  void send_queued();

 private:
  using Flight = StreamSchedule::Flight;
  // The round a slot version delivered last, kept until that slot version delivers again (two
  // rounds later; a resent one then in proofs_due_): an answer that arrives for it afterwards tells
  // whether its resend was needed.
  struct DeliveredRound {
    bool valid = false;
    bool retransmitted = false;
    bool multicast_seen = false;       // the round's own RESULT arrived: it needed no resend to come
    bool taught = false;               // its detector already learned from it (once per round)
    bool completed_by_resend = false;  // its RESULT says a resend completed it (RETX): a loss held it
    uint8_t version = 0;
    RetxCause cause = RetxCause::kNone;
    unsigned slot = 0;
    uint32_t seq = 0, offset = 0;
    int64_t sent_ns = 0, resent_ns = 0, delivered_ns = 0;  // first send, latest send, its answer
  };

  // Starts slot `s`'s next round if its allreduce was admitted (fixed32: its exponent round first);
  // false when it was not.
  bool start_slot(unsigned s, int64_t now);
  // Adaptive: starts the lowest startable chunks while the window allows, and this rank's oldest
  // unfinished chunk even past it.
  void fill_window(int64_t now);
  // Whether chunk `g` (global number) can start now: admitted, its slot free and at it.
  bool startable(uint64_t g) const;
  unsigned window_now(int64_t now) const { return adaptive_ ? cc_.allowed(now) : fixed_window_; }
  // The window this rank's DATA declares (protocol.md §4.2).
  unsigned declared_window() const { return adaptive_ ? cc_.window() : fixed_window_; }
  // Chunks start through fill_window: the window may hold fewer rounds than the pool.
  bool windowed() const { return adaptive_ || fixed_window_ < window_.slots(); }
  void prepare_bootstrap(unsigned slot, size_t c);
  void prepare_chunk(unsigned slot, size_t c, int8_t agreed_exp);
  void launch(unsigned slot, int64_t now);
  void send(unsigned slot);
  // Receives into in_ (counted); returns how many datagrams.
  size_t receive_batch(int64_t wait_ns);
  // Handles one received datagram: an ABORT hint, a HELD, or the RESULT of a current or a past round.
  void receive(const InPacket& in, int64_t now, std::vector<AllreduceOp*>* finished);
  bool current_round(const gs_header& h) const;
  void abort_datagram(const gs_header& h, int64_t now);
  void held(const InPacket& in, const gs_header& h, int64_t now);
  void result(const InPacket& in, const gs_header& h, int64_t now, std::vector<AllreduceOp*>* finished);
  void learn_from_result(const InPacket& in, const gs_header& h, int64_t now);
  void round_done(unsigned slot, int64_t now, std::vector<AllreduceOp*>* finished);
  // Keeps what a delivered round needs for late_answer().
  void remember_delivered(unsigned slot, const gs_header& h, const RoundTimer& t, int64_t now);
  bool partial_chunk(AllreduceOp& op, size_t chunk, uint64_t contributors);
  void keep_unsummed(const AllreduceOp& op, size_t chunk);
  void unsummed_less_estimate(const AllreduceOp& op, size_t chunk);
  // A HELD, or an answer for the round a slot version delivered before: proof of a spurious resend?
  void late_answer(const gs_header& h, int64_t now);
  // The delivered round `h` answers, in last_ or, once its slot version delivered again, among the
  // resent rounds kept in proofs_due_; nullptr when neither holds it.
  DeliveredRound* delivered_round(const gs_header& h);
  LossDetector& detector(unsigned slot) { return loss_[slot % loss_.size()]; }
  // A resend of `cause`, sent at `resent_ns`, proven unneeded: counted, and told to the window (undo).
  void spurious_resend(RetxCause cause, int64_t resent_ns, int64_t now);
  // Sends the slot's round again, its detector having marked the resend (counted by its cause).
  void resend(unsigned slot, int64_t now);
  // Loss detection after the socket was drained; returns the next timer deadline.
  int64_t check_timers(int64_t now);
  // The switch is going: asks again for the rounds this rank has out, so that it holds every sum
  // the switch completed before the ring takes over (see the definition).
  void settle_rounds(int64_t now, std::vector<AllreduceOp*>* finished);
  [[noreturn]] void fail_timeout();
  const AllreduceOp& front_op() const { return *schedule_.flights().front().op; }

  const PathContext& ctx_;
  ControlClient* control_;
  Window window_;
  StreamSchedule schedule_;
  std::vector<Flight*> flight_;  // per slot: the allreduce of its current round
  // fixed32, per slot: the exponent the last RESULT agreed for the slot's next chunk
  std::vector<int8_t> agreed_exp_;
  bool adaptive_;
  unsigned fixed_window_;  // without adaptive_: a numeric window below the pool, else the whole pool
  WindowController cc_;
  ConcedePolicy concede_;   // which chunks go as header-only concedes (deadline jobs, Options::concede)
  unsigned in_flight_ = 0;  // slots with a round out
  // Adaptive start order (fill_window): chunks below scan_ were looked at; those passed over while
  // their slot was busy wait in passed_ (a min-heap) once it is free; oldest_ is the lowest chunk
  // whose sum this rank does not hold.
  uint64_t scan_ = 0, oldest_ = 0;
  std::vector<uint64_t> passed_;
  bool window_limited_ = false;  // the last fill stopped at the window
  std::vector<LossDetector>
      loss_;  // per switch thread (slot s is served by thread s % threads); one timer floor
  std::vector<DeliveredRound> last_;  // per slot and version: [2 * slot + version]
  // Resent rounds whose slot version delivered again before every proof of their resends could
  // arrive (a resend sent late in its round's life, on a request that came late, is answered after
  // later rounds of its slot came back): the latest kProofsDue, oldest overwritten first. Without
  // them such resends stayed unproven and untaught.
  static constexpr size_t kProofsDue = 64;
  std::vector<DeliveredRound> proofs_due_;
  size_t proofs_due_next_ = 0;
  LossInjector drops_;  // the drop_rate test hook, seeded from (seed, rank)
  std::vector<OutPacket> out_;
  // Per slot, its packet's place in out_ (kNotQueued: none). A slot queued twice before a send goes
  // once, as it is then: the packet points into the slot's buffer, which a RESULT handled in the
  // same batch may have sealed with the slot's next round (a PARTIAL RESULT, §3.1, can arrive before
  // this rank's DATA left).
  static constexpr uint32_t kNotQueued = UINT32_MAX;
  std::vector<uint32_t> queued_at_;
  void clear_queue();
  std::vector<unsigned> resend_;
  std::vector<InPacket> in_;
  bool draining_ = false;         // settle_rounds: nothing new starts, ABORT answers refuse
  std::vector<uint8_t> refused_;  // settle_rounds, per slot: the switch refused its round
  int64_t wait_ns_ = 0, last_progress_ns_ = 0, last_timer_check_ = 0, last_notice_check_ = 0;
  int64_t abort_recheck_ns_ = 0;     // an ABORT datagram before this is not checked again (receive)
  bool warned_unconfirmed_ = false;  // one log line for the first ABORT datagram not confirmed
};

}  // namespace gradswitch::worker
