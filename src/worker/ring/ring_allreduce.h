// Paper 001's pipelined ring in software, over the same UDP transport as the switch path
// (docs/protocol.md section 7, docs/algorithms.md). Chunk c travels in slot c mod W; slot s has
// root s mod N. The root sends its chunk to the next rank, each rank adds its own chunk to the
// arriving packet and forwards it at once, and the last rank (root - 1) holds the sum and sends
// it back along the reverse path, every rank keeping it on the way. Aggregation and broadcast are
// pipelined packet by packet and use the two directions of every link.
//
// Loss recovery follows the switch's design: a rank that forwarded a partial sum keeps it and
// resends it (the LossDetector, one per position in the chain, since answers from far down the
// chain take longer); a rank that already holds a round's sum answers a resent partial with it (a
// shadow copy per slot version), so nothing is ever added twice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/loss_detector.h"
#include "common/rng.h"
#include "worker/chunk_codec.h"
#include "worker/path.h"
#include "worker/stream_schedule.h"
#include "worker/window.h"

namespace gradswitch::worker {

struct RingPeer {
  uint32_t ipv4_be = 0;  // network order
  uint16_t port = 0;     // host order
};

struct RingConfig {
  std::vector<RingPeer> peers;  // every rank's UDP address, by rank
  uint32_t job_id = 0, key = 0;
  unsigned slots = 256;
  uint32_t payload_bytes = GS_DEFAULT_PAYLOAD_BYTES;
};

class RingAllreduce : public DataPath {
 public:
  RingAllreduce(const PathContext& ctx, const RingConfig& cfg);

  const char* name() const override { return "ring"; }

  // Whether the ring can reduce these chunks (float64 travels only through the switch).
  static bool carries(const Chunking& ch);

  // Allreduces stream back to back (stream_schedule.h). An op's `done` (null, or one entry per
  // chunk) marks chunks whose sum the tensor already holds (an allreduce the switch left
  // unfinished): this rank contributes that sum instead of an input, and the sum wins over any
  // partial. Reads the input at op.input(), writes the sums to op.base (none when it is null).
  // step() throws TimeoutError / Error; idle, it serves the neighbours until woken. Each admitted
  // allreduce counts in Counters::ring_allreduces.
  void admit(AllreduceOp* op) override;
  void step(std::vector<AllreduceOp*>* finished) override;
  bool idle() const override { return schedule_.empty(); }
  // Runs one allreduce to completion (admit + step until it finished).
  void run(AllreduceOp& op);

  // Answers the neighbours' resent partials of finished rounds and keeps packets that already
  // belong to allreduces not admitted here yet, until `timeout_ns` passed or the transport was
  // woken.
  bool serves_when_idle() const override { return true; }
  void serve(int64_t timeout_ns) override;

  // Before the group closes: serves until the previous rank said it holds every sum of the last
  // allreduce (RING_DONE), at most `max_s` seconds. Returns whether it did.
  bool linger(double max_s) override;

  const RingConfig& config() const { return cfg_; }

 private:
  enum class State : uint8_t { kIdle, kWaiting, kForwarded, kDone };
  struct Round {
    State state = State::kIdle;
    bool bootstrap = false;
    bool own_sum = false;  // this rank contributes a sum it already holds
    uint8_t version = 0;
    uint8_t elem = 0;              // gs_elem_type on the wire
    int8_t scale = GS_EXP_NONE;    // fixed32 data round: S
    int8_t own_exp = GS_EXP_NONE;  // fixed32: the exponent this rank announces
    uint16_t count = 0;
    uint32_t seq = 0, offset = 0;
    size_t chunk = 0;
  };
  struct Shadow {  // the RESULT of a finished round, per (slot, version)
    bool valid = false;
    uint32_t seq = 0, offset = 0, len = 0;
    gs_header hdr{};  // as sent (answers set UNICAST and re-encode it)
  };
  using Flight = StreamSchedule::Flight;

  unsigned position(unsigned slot) const;  // 0 = root ... N-1 = last
  gs_header header(uint8_t type, unsigned slot, const Round& r) const;
  // A PARTIAL or RESULT passed on: the agreed next exponent, SUM when `sum` is held.
  gs_header forward_header(uint8_t type, unsigned slot, const Round& r, int8_t next_exp, bool sum) const;
  // Writes a round's finished sum (its wire bytes; `sum`: SUM encoding) into the tensor.
  void store_result(const Round& r, const AllreduceOp& op, const uint8_t* bytes, bool sum);
  // Keeps the RESULT whose payload (`len` bytes) is in the shadow packet of (`slot`, `version`),
  // to answer resent partials, and sends it to the previous rank.
  void send_result_back(unsigned slot, uint8_t version, const Round& r, const gs_header& oh, size_t len);
  using Finished = std::vector<AllreduceOp*>;
  // Starts slot `slot`'s next round if its allreduce was admitted (fixed32: its exponent round first).
  void start_slot(unsigned slot, int64_t now, Finished* finished);
  void launch(unsigned slot, size_t c, bool bootstrap, int8_t agreed_exp, int64_t now, Finished* finished);
  void finish_round(unsigned slot, int8_t agreed_exp, int64_t now, Finished* finished);
  void receive(const uint8_t* p, uint32_t len, int64_t now, Finished* finished);
  void on_partial(const gs_header& h, const uint8_t* payload, int64_t now, Finished* finished);
  void on_result(const gs_header& h, const uint8_t* payload, int64_t now, Finished* finished);
  void answer_from_shadow(unsigned slot, uint8_t version);
  void stash_early(const uint8_t* p, uint32_t len);
  void ignore() { counter_add(ctx_.counters->ignored); }  // a datagram with no use here
  void queue(const uint8_t* data, uint32_t len, unsigned rank, bool droppable);
  void flush();
  void send_done(uint32_t seq);
  int64_t check_timers(int64_t now);
  [[noreturn]] void fail_timeout();
  uint8_t* shadow_packet(unsigned slot, uint8_t version) {
    return shadow_mem_.data() + cap_ * (2 * slot + version);
  }

  const PathContext& ctx_;
  RingConfig cfg_;
  unsigned N_, rank_, next_, prev_;
  size_t cap_;
  Window window_;  // the partial this rank forwarded per slot (resent on loss), versions, timers
  std::vector<Round> rounds_;
  std::vector<uint8_t> shadow_mem_;
  std::vector<Shadow> shadows_;
  std::vector<std::vector<uint8_t>> early_;  // per slot: a partial of the next allreduce
  std::vector<LossDetector> loss_;           // per position 0..N-2
  StreamSchedule schedule_;
  std::vector<Flight*> flight_;              // per slot: the allreduce of its current round
  std::vector<AllreduceOp*> solo_finished_;  // finished in admit() (one rank), reported by step()
  int64_t wait_ns_ = 0, last_progress_ns_ = 0, last_timer_check_ = 0;
  LossInjector drops_;  // the drop_rate test hook, seeded from (seed, rank)
  std::vector<OutPacket> out_;
  std::vector<unsigned> resend_;
  std::vector<InPacket> in_;
  uint8_t done_pkt_[GS_HEADER_BYTES];
  bool have_last_seq_ = false;
  uint32_t last_seq_ = 0;  // the newest allreduce this rank finished
  bool prev_done_valid_ = false;
  uint32_t prev_done_seq_ = 0;  // the last RING_DONE from the previous rank
};

}  // namespace gradswitch::worker
