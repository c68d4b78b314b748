// The pipelined ring allreduce (see ring_allreduce.h and docs/protocol.md section 7).
#include "worker/ring/ring_allreduce.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>

#include "common/clock.h"
#include "common/counter.h"
#include "common/fixed_point.h"
#include "common/header.h"
#include "common/seq.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"

namespace gradswitch::worker {

namespace {

int64_t now_ns() {
  return steady_now_ns();
}

std::string address_text(const RingPeer& p) {
  char ip[INET_ADDRSTRLEN] = "?";
  in_addr a{};
  a.s_addr = p.ipv4_be;
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(p.port);
}

}  // namespace

RingAllreduce::RingAllreduce(const PathContext& ctx, const RingConfig& cfg)
    : ctx_(ctx),
      cfg_(cfg),
      N_(static_cast<unsigned>(cfg.peers.size())),
      rank_(ctx.opt->rank),
      next_((ctx.opt->rank + 1) % static_cast<unsigned>(cfg.peers.size())),
      prev_((ctx.opt->rank + static_cast<unsigned>(cfg.peers.size()) - 1) %
            static_cast<unsigned>(cfg.peers.size())),
      cap_((GS_HEADER_BYTES + cfg.payload_bytes + 63) & ~size_t{63}),
      window_(cfg.slots, cfg.payload_bytes),
      rounds_(cfg.slots),
      shadow_mem_(cap_ * 2 * cfg.slots, 0),
      shadows_(2 * cfg.slots),
      early_(cfg.slots),
      schedule_(cfg.slots),
      flight_(cfg.slots, nullptr),
      drops_(ctx.opt->drop_rate, ctx.opt->seed, ctx.opt->rank),
      in_(1024) {
  const int64_t rto_min = static_cast<int64_t>(ctx.opt->rto_initial_s * 1e9);
  const int64_t rto_max = static_cast<int64_t>(ctx.opt->rto_max_s * 1e9);
  for (unsigned p = 0; p + 1 < N_; ++p) loss_.emplace_back(rto_min, rto_max);
  out_.reserve(2 * cfg.slots + 64);
}

unsigned RingAllreduce::position(unsigned slot) const {
  return (rank_ + N_ - slot % N_) % N_;
}

gs_header RingAllreduce::header(uint8_t type, unsigned slot, const Round& r) const {
  return HeaderBuilder(type, cfg_.job_id, cfg_.key)
      .rank(static_cast<uint16_t>(rank_))
      .slot(static_cast<uint16_t>(slot))
      .flags(r.version)
      .elems(r.elem, r.count)
      .round(r.seq, r.offset)
      .exps(r.own_exp, r.scale);
}

gs_header RingAllreduce::forward_header(uint8_t type, unsigned slot, const Round& r, int8_t next_exp,
                                        bool sum) const {
  gs_header h = header(type, slot, r);
  h.next_exp = next_exp;
  if (sum) h.flags |= GS_FLAG_SUM;
  return h;
}

void RingAllreduce::store_result(const Round& r, const AllreduceOp& op, const uint8_t* bytes, bool sum) {
  if (r.bootstrap) return;  // an exponent round carries no sum
  if (sum)
    decode_sum(op.ch, bytes, r.chunk, op.base);
  else
    decode_chunk(op.ch, bytes, r.chunk, r.scale, op.base);
}

void RingAllreduce::send_result_back(unsigned slot, uint8_t version, const Round& r, const gs_header& oh,
                                     size_t len) {
  Shadow& sh = shadows_[2 * slot + version];
  sh = Shadow{true, r.seq, r.offset, static_cast<uint32_t>(GS_HEADER_BYTES + len), oh};
  gs_header_encode(&oh, shadow_packet(slot, version));
  queue(shadow_packet(slot, version), sh.len, prev_, true);
}

void RingAllreduce::queue(const uint8_t* data, uint32_t len, unsigned rank, bool droppable) {
  if (droppable && drops_.drop()) {
    counter_add(ctx_.counters->injected_drops);
    return;
  }
  out_.push_back(OutPacket{data, len, cfg_.peers[rank].port, cfg_.peers[rank].ipv4_be});
}

void RingAllreduce::flush() {
  send_counted(ctx_, &out_);
}

void RingAllreduce::send_done(uint32_t seq) {
  Round r;
  r.seq = seq;
  gs_header h = header(GS_MSG_RING_DONE, 0, r);
  gs_header_encode(&h, done_pkt_);
  queue(done_pkt_, GS_HEADER_BYTES, next_, false);
}

void RingAllreduce::launch(unsigned slot, size_t c, bool bootstrap, int8_t agreed_exp, int64_t now,
                           std::vector<AllreduceOp*>* finished) {
  const Flight& f = *flight_[slot];
  const AllreduceOp& op = *f.op;
  if (op.times) op.times->sent(now);  // the round begins here (a forwarding rank sends on arrival)
  const bool fixed = op.ch.elem == GS_ELEM_FIXED32;
  Round& r = rounds_[slot];
  r.bootstrap = bootstrap;
  r.chunk = c;
  r.version = window_.claim_version(slot);
  r.seq = op.seq;
  r.offset = op.ch.offset(c);
  r.count = bootstrap ? 0 : op.ch.size(c);
  r.elem = bootstrap ? static_cast<uint8_t>(GS_ELEM_FIXED32) : op.ch.elem;
  r.own_sum = !bootstrap && op.done && (*op.done)[c];
  r.scale = GS_EXP_NONE;
  r.own_exp = GS_EXP_NONE;
  if (fixed) {
    if (bootstrap) {
      r.own_exp = (*op.exps)[c];
    } else {
      r.scale = static_cast<int8_t>(scale_exponent(agreed_exp, N_));
      size_t after = schedule_.following(f, c);
      r.own_exp = after != SIZE_MAX ? (*op.exps)[after] : static_cast<int8_t>(GS_EXP_NONE);
    }
  }
  if (position(slot) != 0) {
    r.state = State::kWaiting;
    // A partial that arrived before this round began here.
    std::vector<uint8_t>& e = early_[slot];
    if (!e.empty()) {
      std::vector<uint8_t> pkt;
      pkt.swap(e);
      gs_header h;
      gs_header_decode(pkt.data(), &h);
      if ((h.flags & GS_FLAG_VERSION) == r.version && h.seq == r.seq && h.offset == r.offset)
        on_partial(h, pkt.data() + GS_HEADER_BYTES, now, finished);
    }
    return;
  }
  size_t len = 0;
  gs_header h = header(GS_MSG_RING_PARTIAL, slot, r);
  if (r.own_sum) {
    len = encode_sum(op.ch, op.base, c, window_.payload(slot));
    h.flags |= GS_FLAG_SUM;
  } else if (!bootstrap) {
    len = encode_chunk(op.ch, op.input(), c, r.scale, window_.payload(slot));
  }
  window_.seal(slot, h, len);
  r.state = State::kForwarded;
  loss_[0].launch(window_.timer(slot), now);
  queue(window_.packet(slot), window_.round(slot).len, next_, true);
}

void RingAllreduce::start_slot(unsigned slot, int64_t now, std::vector<AllreduceOp*>* finished) {
  size_t c = 0;
  Flight* f = schedule_.next(slot, &c);
  if (!f) return;  // its next chunk belongs to an allreduce not admitted yet
  flight_[slot] = f;
  launch(slot, c, f->op->ch.elem == GS_ELEM_FIXED32 && schedule_.first_in_slot(c), GS_EXP_NONE, now,
         finished);
}

void RingAllreduce::finish_round(unsigned slot, int8_t agreed_exp, int64_t now,
                                 std::vector<AllreduceOp*>* finished) {
  Round& r = rounds_[slot];
  r.state = State::kDone;
  last_progress_ns_ = now;
  Flight* f = flight_[slot];
  if (AllreduceTimes* t = f->op->times) t->result(now);
  if (r.bootstrap) return launch(slot, r.chunk, false, agreed_exp, now, finished);
  size_t after = schedule_.following(*f, r.chunk);
  AllreduceOp* whole = f->op;
  if (schedule_.finish(slot, f)) {
    finished->push_back(whole);
    if (!have_last_seq_ || seq_after(whole->seq, last_seq_)) last_seq_ = whole->seq;
    have_last_seq_ = true;
    // Allreduces can finish out of order (a short one behind a long one): RING_DONE(seq) promises
    // every sum up to seq, so it is sent only when no admitted allreduce is left unfinished.
    if (schedule_.empty()) send_done(last_seq_);
  }
  if (after != SIZE_MAX)
    launch(slot, after, false, agreed_exp, now, finished);
  else
    start_slot(slot, now, finished);
}

void RingAllreduce::answer_from_shadow(unsigned slot, uint8_t version) {
  Shadow& sh = shadows_[2 * slot + version];
  uint8_t* p = shadow_packet(slot, version);
  if (!(sh.hdr.flags & GS_FLAG_UNICAST)) {
    sh.hdr.flags |= GS_FLAG_UNICAST;
    gs_header_encode(&sh.hdr, p);
  }
  queue(p, sh.len, prev_, true);
}

void RingAllreduce::stash_early(const uint8_t* p, uint32_t len) {
  gs_header h;
  gs_header_decode(p, &h);
  early_[h.slot].assign(p, p + len);
}

void RingAllreduce::on_partial(const gs_header& h, const uint8_t* payload, int64_t now,
                               std::vector<AllreduceOp*>* finished) {
  const unsigned s = h.slot;
  const uint8_t v = h.flags & GS_FLAG_VERSION;
  Round& r = rounds_[s];
  // This rank roots the slot: its previous rank sends it results, never partials.
  if (position(s) == 0) return ignore();
  const bool same = r.state != State::kIdle && v == r.version && h.seq == r.seq && h.offset == r.offset;
  if (!same || r.state == State::kDone) {
    // A resent partial of a round finished here, or one of the next allreduce.
    const Shadow& sh = shadows_[2 * s + v];
    if (sh.valid && sh.seq == h.seq && sh.offset == h.offset) return answer_from_shadow(s, v);
    if (r.state == State::kIdle ||
        (r.state == State::kDone && round_is_newer(h.seq, h.offset, r.seq, r.offset))) {
      return stash_early(payload - GS_HEADER_BYTES,
                         static_cast<uint32_t>(GS_HEADER_BYTES + gs_payload_bytes(h.elem_type, h.count)));
    }
    return ignore();
  }
  if (r.state == State::kForwarded) return ignore();  // a duplicate: this rank's own timer covers the rest
  const AllreduceOp& op = *flight_[s]->op;
  if (h.count != r.count || h.elem_type != r.elem ||
      (op.ch.elem == GS_ELEM_FIXED32 && !r.bootstrap && h.scale_exp != r.scale))
    throw Error("gradswitch: " + ctx_.job_text + ", ring allreduce seq " + std::to_string(r.seq) + ": rank " +
                std::to_string(h.rank) + " sent " + std::to_string(h.count) + " " +
                gs_elem_name(h.elem_type) + " elements at offset " + std::to_string(h.offset) +
                " where this rank has " + std::to_string(r.count) + " " + gs_elem_name(r.elem) +
                ": the ranks' allreduce calls differ in size or type");
  const bool sum = (h.flags & GS_FLAG_SUM) || r.own_sum;
  const int8_t next_exp = std::max(h.next_exp, r.own_exp);
  const bool last = position(s) == N_ - 1;
  uint8_t* out = last ? shadow_packet(s, v) + GS_HEADER_BYTES : window_.payload(s);
  size_t len = 0;
  if (r.bootstrap) {
    len = 0;
  } else if (h.flags & GS_FLAG_SUM) {  // someone held the sum already: it wins
    len = gs_payload_bytes(op.ch.elem, r.count);
    std::memcpy(out, payload, len);
  } else if (r.own_sum) {
    len = encode_sum(op.ch, op.base, r.chunk, out);
  } else {
    accumulate_chunk(op.ch, op.input(), r.chunk, r.scale, payload, out);
    len = gs_payload_bytes(op.ch.elem, r.count);
  }
  const gs_header oh = forward_header(last ? GS_MSG_RING_RESULT : GS_MSG_RING_PARTIAL, s, r, next_exp, sum);
  if (!last) {
    window_.seal(s, oh, len);
    r.state = State::kForwarded;
    loss_[position(s)].launch(window_.timer(s), now);
    queue(window_.packet(s), window_.round(s).len, next_, true);
    last_progress_ns_ = now;
    return;
  }
  // The last rank of the chain: `out` (the shadow's payload) is the finished sum.
  store_result(r, op, out, sum);
  send_result_back(s, v, r, oh, len);
  finish_round(s, next_exp, now, finished);
}

void RingAllreduce::on_result(const gs_header& h, const uint8_t* payload, int64_t now,
                              std::vector<AllreduceOp*>* finished) {
  const unsigned s = h.slot;
  const uint8_t v = h.flags & GS_FLAG_VERSION;
  Round& r = rounds_[s];
  if (r.state != State::kForwarded || v != r.version || h.seq != r.seq || h.offset != r.offset ||
      h.count != r.count || h.elem_type != r.elem)
    return ignore();  // a duplicate, or an answer to an earlier resend
  if (h.flags & GS_FLAG_UNICAST) counter_add(ctx_.counters->unicast_results);
  const AllreduceOp& op = *flight_[s]->op;
  loss_[position(s)].delivered(window_.timer(s), now);
  const bool sum = h.flags & GS_FLAG_SUM;
  const size_t len = gs_payload_bytes(op.ch.elem, h.count);
  store_result(r, op, payload, sum);
  if (position(s) != 0) {  // keep it for the previous rank and pass it on
    std::memcpy(shadow_packet(s, v) + GS_HEADER_BYTES, payload, len);
    send_result_back(s, v, r, forward_header(GS_MSG_RING_RESULT, s, r, h.next_exp, sum), len);
  }
  finish_round(s, h.next_exp, now, finished);
}

void RingAllreduce::receive(const uint8_t* p, uint32_t len, int64_t now,
                            std::vector<AllreduceOp*>* finished) {
  gs_header h;
  if (!decode_job_header(p, len, cfg_.job_id, cfg_.key, &h) || h.slot >= cfg_.slots) return ignore();
  const size_t bytes = gs_payload_bytes(h.elem_type, h.count);
  const bool data = h.type == GS_MSG_RING_PARTIAL || h.type == GS_MSG_RING_RESULT;
  if (data && (gs_elem_size(h.elem_type) == 0 || len < GS_HEADER_BYTES + bytes || bytes > cfg_.payload_bytes))
    return ignore();
  if (h.type == GS_MSG_RING_PARTIAL && h.rank == prev_)
    return on_partial(h, p + GS_HEADER_BYTES, now, finished);
  if (h.type == GS_MSG_RING_RESULT && h.rank == next_)
    return on_result(h, p + GS_HEADER_BYTES, now, finished);
  if (h.type == GS_MSG_RING_DONE && h.rank == prev_) {
    if (!prev_done_valid_ || seq_after(h.seq, prev_done_seq_)) prev_done_seq_ = h.seq;
    prev_done_valid_ = true;
    return;
  }
  ignore();  // e.g. a late answer of the switch after a fallback
}

int64_t RingAllreduce::check_timers(int64_t now) {
  int64_t next = INT64_MAX;
  for (unsigned p = 0; p + 1 < N_; ++p) {
    resend_.clear();
    next = std::min(
        next, loss_[p].scan(window_.timers(), window_.slots(), now, &resend_, (rank_ + N_ - p) % N_, N_));
    for (unsigned s : resend_) {
      window_.mark_retransmission(s);
      counter_add(ctx_.counters->retransmissions);
      if (flight_[s] && flight_[s]->op->times) flight_[s]->op->times->retransmit(now, s, rounds_[s].chunk);
      queue(window_.packet(s), window_.round(s).len, next_, true);
    }
  }
  return next;
}

bool RingAllreduce::carries(const Chunking& ch) {
  return ch.dtype != DType::kFloat64 && ch.elem != GS_ELEM_FLOAT64 && ch.elem != GS_ELEM_MX8;
}

void RingAllreduce::admit(AllreduceOp* op) {
  counter_add(ctx_.counters->ring_allreduces);  // also the one it refuses, as the Group counted them
  const AllreduceOp& o = *op;
  if (!carries(o.ch))
    throw UnsupportedType(
        "gradswitch: the ring carries float32 and int32 tensors on 32- and 16-bit wires; " + ctx_.job_text +
        " cannot reduce float64 tensors or the mx8 wire on it (reduce them through the switch)");
  if (N_ == 1) {  // the sum of one rank, in the wire type's precision like the switch's
    std::vector<uint8_t> buf(cfg_.payload_bytes);
    for (size_t c = 0; c < o.ch.chunks; ++c) {
      if (o.done && (*o.done)[c]) continue;
      int s = o.exps ? scale_exponent((*o.exps)[c], 1) : 0;
      encode_chunk(o.ch, o.input(), c, s, buf.data());
      if (o.base) decode_chunk(o.ch, buf.data(), c, s, o.base);
    }
    solo_finished_.push_back(op);
    return;
  }
  int64_t now = now_ns();
  if (schedule_.empty()) {  // the stream starts (again): idle time is no lack of progress
    for (auto& l : loss_) l.begin();
    last_progress_ns_ = last_timer_check_ = now;
    wait_ns_ = 0;
  }
  schedule_.admit(op);
  std::vector<AllreduceOp*> finished;  // a round can finish here at once only with early packets
  for (unsigned s = 0; s < cfg_.slots; ++s)
    if (rounds_[s].state == State::kIdle || rounds_[s].state == State::kDone) start_slot(s, now, &finished);
  solo_finished_.insert(solo_finished_.end(), finished.begin(), finished.end());
  flush();
}

void RingAllreduce::step(std::vector<AllreduceOp*>* finished) {
  if (!solo_finished_.empty()) {
    finished->insert(finished->end(), solo_finished_.begin(), solo_finished_.end());
    solo_finished_.clear();
  }
  if (schedule_.empty()) return serve(100'000'000);  // idle: answer the neighbours until woken
  if (ctx_.cancel->load(std::memory_order_relaxed))
    throw Error("gradswitch: ring allreduce seq " + std::to_string(schedule_.flights().front().op->seq) +
                " cancelled: the group of " + ctx_.job_text + " was closed");
  const int64_t timeout_ns = static_cast<int64_t>(ctx_.opt->timeout_s * 1e9);
  Transport& tx = *ctx_.transport;
  size_t got = tx.recv_batch(in_.data(), in_.size(), wait_ns_);
  int64_t now = now_ns();
  uint64_t rbytes = 0;
  for (size_t i = 0; i < got; ++i) {
    rbytes += in_[i].len;
    receive(in_[i].data, in_[i].len, now, finished);
  }
  counter_add(ctx_.counters->packets_received, got);
  counter_add(ctx_.counters->bytes_received, rbytes);
  flush();
  if (schedule_.empty()) return;
  if (tx.more_pending() && now - last_timer_check_ < loss_[0].rto_min_ns()) {
    wait_ns_ = 0;
    return;
  }
  last_timer_check_ = now;
  int64_t next_deadline = std::min(check_timers(now), last_progress_ns_ + timeout_ns);
  flush();
  if (now - last_progress_ns_ >= timeout_ns) fail_timeout();
  wait_ns_ = std::max<int64_t>(next_deadline - now, 0);
}

void RingAllreduce::run(AllreduceOp& op) {
  admit(&op);
  std::vector<AllreduceOp*> finished;
  while (!idle() || !solo_finished_.empty()) step(&finished);
}

void RingAllreduce::serve(int64_t timeout_ns) {
  size_t got = ctx_.transport->recv_batch(in_.data(), in_.size(), timeout_ns);
  int64_t now = now_ns();
  std::vector<AllreduceOp*> none;  // idle: nothing can finish
  for (size_t i = 0; i < got; ++i) receive(in_[i].data, in_[i].len, now, &none);
  counter_add(ctx_.counters->packets_received, got);
  flush();
}

bool RingAllreduce::linger(double max_s) {
  if (!have_last_seq_ || N_ == 1) return true;
  const int64_t deadline = now_ns() + static_cast<int64_t>(max_s * 1e9);
  for (;;) {
    if (prev_done_valid_ && seq_at_or_after(prev_done_seq_, last_seq_)) return true;
    int64_t left = deadline - now_ns();
    if (left <= 0) return false;
    send_done(last_seq_);  // again: the next rank may be lingering for a lost one
    flush();
    serve(std::min<int64_t>(left, 20'000'000));
  }
}

void RingAllreduce::fail_timeout() {
  unsigned slot = 0;
  uint64_t best = UINT64_MAX;
  for (unsigned s = 0; s < cfg_.slots; ++s)
    if ((rounds_[s].state == State::kWaiting || rounds_[s].state == State::kForwarded) && flight_[s]) {
      uint64_t g = schedule_.global(*flight_[s], rounds_[s].chunk);
      if (g < best) {
        best = g;
        slot = s;
      }
    }
  const Round& r = rounds_[slot];
  std::ostringstream addrs;
  for (unsigned k = 0; k < N_; ++k) addrs << (k ? ", " : "") << k << "=" << address_text(cfg_.peers[k]);
  std::ostringstream secs;
  secs.precision(3);
  secs << ctx_.opt->timeout_s;
  std::string what = r.bootstrap
                         ? "the fixed32 exponent round of the chunk at element " + std::to_string(r.offset)
                         : "the chunk at element " + std::to_string(r.offset);
  std::string downstream;  // the rest of the chain: this rank's next up to the slot's last rank
  unsigned more = 0;
  for (unsigned p = position(slot) + 1; p < N_; ++p, ++more)
    downstream += (more ? ", " : "") + std::to_string((rank_ + more + 1) % N_);
  std::string wait = r.state == State::kWaiting
                         ? "this rank waits for the partial sum of " + what + " from rank " +
                               std::to_string(prev_) + ": is rank " + std::to_string(prev_) +
                               " alive, and does it make the same allreduce calls?"
                         : "this rank sent its partial sum of " + what + " to rank " + std::to_string(next_) +
                               " and waits for the finished sum to come back: " +
                               (more > 1 ? "are ranks " + downstream + " alive, and do they"
                                         : "is rank " + downstream + " alive, and does it") +
                               " make the same allreduce calls?";
  throw TimeoutError("gradswitch: ring allreduce timed out: " + ctx_.job_text + ", allreduce seq " +
                     std::to_string(r.seq) + " made no progress for " + secs.str() + " s; " + wait +
                     " Check also that UDP datagrams of up to " +
                     std::to_string(GS_HEADER_BYTES + cfg_.payload_bytes) +
                     " bytes pass between the ranks (ring addresses " + addrs.str() + ").");
}

}  // namespace gradswitch::worker
