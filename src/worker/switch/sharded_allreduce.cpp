// A job striped over several switches (see sharded_allreduce.h).
#include "worker/switch/sharded_allreduce.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "common/clock.h"
#include "common/counter.h"
#include "gradswitch/wire.h"
#include "worker/errors.h"
#include "worker/switch/switch_notice.h"

namespace gradswitch::worker {

namespace {

int64_t now_ns() {
  return steady_now_ns();
}

}  // namespace

ShardedAllreduce::ShardedAllreduce(const PathContext& ctx, const std::vector<SwitchRef>& switches)
    : ctx_(ctx), in_(1024) {
  const size_t n = switches.size();
  for (size_t i = 0; i < n; ++i) {
    const SwitchRef& link = switches[i];
    auto shard = std::make_unique<Shard>();
    shard->ctx = ctx;
    shard->ctx.join = link.join;
    shard->ctx.switch_ipv4_be = link.ipv4_be;
    // Every message of this switch's path names it: which of the job's switches failed matters.
    const std::string at = link.control ? link.control->endpoint() : "?";
    shard->ctx.job_text = "job '" + ctx.opt->job + "' (job_id " + std::to_string(link.join->job_id) +
                          " at the switch " + at + ", shard " + std::to_string(i + 1) + " of " +
                          std::to_string(n) + ", rank " + std::to_string(ctx.opt->rank) + " of " +
                          std::to_string(ctx.opt->world) + ")";
    shard->path = std::make_unique<SwitchAllreduce>(shard->ctx, link.control);
    shard->control = link.control;
    shards_.push_back(std::move(shard));
  }
}

bool ShardedAllreduce::idle() const {
  return std::all_of(shards_.begin(), shards_.end(), [](auto& s) { return s->path->idle(); });
}

void ShardedAllreduce::admit(AllreduceOp* op) {
  const unsigned n = static_cast<unsigned>(shards_.size());
  Split& sp = splits_.emplace_back();
  sp.whole = op;
  sp.parts.reserve(n);
  sp.exps.resize(n);
  sp.done.resize(n);
  for (unsigned i = 0; i < n; ++i) {
    Chunking ch = shard_chunking(op->ch, i, n);
    if (ch.chunks == 0) continue;  // a tensor of fewer than n chunks leaves this switch out
    AllreduceOp part = *op;
    part.ch = ch;
    const size_t k = sp.parts.size();
    if (op->exps) {
      for (size_t c = 0; c < ch.chunks; ++c)
        sp.exps[k].push_back((*op->exps)[ch.tensor_chunk(c) - op->ch.first]);
      part.exps = &sp.exps[k];
    }
    if (op->done) {
      sp.done[k].assign(ch.chunks, 0);
      part.done = &sp.done[k];
    }
    sp.parts.push_back(part);
    sp.shard.push_back(i);
    ++sp.remaining;
  }
  for (size_t k = 0; k < sp.parts.size(); ++k) shards_[sp.shard[k]]->path->admit(&sp.parts[k]);
}

void ShardedAllreduce::merge_done(const Split& sp) const {
  if (!sp.whole->done) return;
  for (size_t k = 0; k < sp.parts.size(); ++k)
    for (size_t c = 0; c < sp.parts[k].ch.chunks; ++c)
      if (sp.done[k][c]) (*sp.whole->done)[sp.parts[k].ch.tensor_chunk(c) - sp.whole->ch.first] = 1;
}

void ShardedAllreduce::blame_lost_switch() {
  // A switch that died also fails the others' rounds soon after (the ranks that saw it first leave
  // the job there): when one of this job's switches is gone, that is the error to report.
  if (splits_.empty()) return;
  for (auto& s : shards_) {
    if (!s->control) continue;
    SwitchNotice n = s->control->poll_notice();
    if (n.kind == SwitchNotice::Kind::kClosed)
      throw_notice(s->ctx, *s->control, n, *splits_.front().whole, /*started=*/true);
  }
}

void ShardedAllreduce::step(std::vector<AllreduceOp*>* finished) {
  part_finished_.clear();
  try {
    for (auto& s : shards_) s->path->check_cancel();
    Transport& tx = *ctx_.transport;
    const size_t got = tx.recv_batch(in_.data(), in_.size(), wait_ns_);
    const int64_t now = now_ns();
    uint64_t bytes = 0;
    for (auto& s : shards_) s->in.clear();
    for (size_t i = 0; i < got; ++i) {
      bytes += in_[i].len;
      auto owner = std::find_if(shards_.begin(), shards_.end(),
                                [&](auto& s) { return s->path->owns(in_[i].data, in_[i].len); });
      if (owner != shards_.end())
        (*owner)->in.push_back(in_[i]);
      else
        counter_add(ctx_.counters->ignored);
    }
    counter_add(ctx_.counters->packets_received, got);
    counter_add(ctx_.counters->bytes_received, bytes);
    int64_t wait = std::numeric_limits<int64_t>::max();
    for (auto& s : shards_) {
      std::exception_ptr lost = s->path->take(s->in.data(), s->in.size(), now, &part_finished_);
      if (s->path->idle() && !lost) {  // nothing of it in flight: no timers to keep
        s->path->send_queued();
        continue;
      }
      wait = std::min(wait, s->path->service(now, got == 0, lost, /*own_transport=*/false, &part_finished_));
    }
    wait_ns_ = wait == std::numeric_limits<int64_t>::max() ? 0 : wait;
  } catch (const SwitchLostError& e) {
    for (const Split& sp : splits_) merge_done(sp);
    if (e.reason() == GS_ABORT_RANK_LEFT && !e.lost().empty() && !splits_.empty()) {
      // Another rank lost one of the job's switches first and left this one (LEAVE lost=): name the
      // lost switch, first-hand if this rank's own connection to it has closed meanwhile.
      blame_lost_switch();
      for (auto& s : shards_)
        if (s->control && s->control->endpoint() == e.lost())
          throw_lost_elsewhere(s->ctx, *s->control, e, *splits_.front().whole);
    }
    throw;
  } catch (...) {
    for (const Split& sp : splits_) merge_done(sp);
    blame_lost_switch();
    throw;
  }
  for (AllreduceOp* part : part_finished_)
    for (auto it = splits_.begin(); it != splits_.end(); ++it) {
      if (part < it->parts.data() || part >= it->parts.data() + it->parts.size()) continue;
      if (--it->remaining == 0) {
        merge_done(*it);
        finished->push_back(it->whole);
        splits_.erase(it);
      }
      break;
    }
}

}  // namespace gradswitch::worker
