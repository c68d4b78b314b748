// A job sharded over several switches (docs/scaling.md): the worker joins the same job on every
// switch of its list, and each allreduce's chunks are striped over them, chunk c to switch
// c mod S (chunk_codec.h: shard_chunking), so each switch sums a disjoint share of the tensor and
// the aggregate capacity grows with S. Each switch keeps its own SwitchAllreduce (window, loss
// detector, timers, control connection): the two-level protocol is not involved, every switch sees
// an ordinary job. One UDP socket serves them all; datagrams go to the switch whose job they name.
// A switch that fails (ABORT, EVENT, its connection closing, a timeout) ends the allreduce with its
// error, which names that switch.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "worker/control.h"
#include "worker/path.h"
#include "worker/switch/switch_allreduce.h"
#include "worker/switch/switch_notice.h"

namespace gradswitch::worker {

// One switch of a sharded job: its control connection, its JOIN reply and its address.
struct SwitchLink {
  std::unique_ptr<ControlClient> control;
  JoinInfo join;
  uint32_t ipv4_be = 0;
};
// The same, borrowed (the Group owns its first switch's connection apart from the others).
struct SwitchRef {
  ControlClient* control = nullptr;
  const JoinInfo* join = nullptr;
  uint32_t ipv4_be = 0;
};

class ShardedAllreduce : public DataPath {
 public:
  // `switches`: every switch of the job, in the order every rank gave them. They outlive this.
  ShardedAllreduce(const PathContext& ctx, const std::vector<SwitchRef>& switches);

  const char* name() const override { return "switch"; }
  void admit(AllreduceOp* op) override;
  void step(std::vector<AllreduceOp*>* finished) override;
  bool idle() const override;
  bool tracks_done() const override { return true; }
  // What the first switch's control connection brought while no allreduce ran (the other switches'
  // notices end the next allreduce instead, from its first step).
  void resume(const AllreduceOp& next) override { throw_idle_notice(ctx_, shards_.front()->control, next); }

 private:
  struct Shard {
    PathContext ctx;
    std::unique_ptr<SwitchAllreduce> path;
    ControlClient* control = nullptr;
    std::vector<InPacket> in;  // this step's datagrams of its job
  };
  // An allreduce cut into its shards' parts (each an allreduce of the same tensor's chunks c mod S).
  struct Split {
    AllreduceOp* whole = nullptr;
    std::vector<AllreduceOp> parts;          // reserved: the shards hold pointers into it
    std::vector<std::vector<int8_t>> exps;   // fixed32: each part's block exponents
    std::vector<std::vector<uint8_t>> done;  // each part's chunks whose sum arrived
    std::vector<unsigned> shard;             // the shard of each part
    unsigned remaining = 0;                  // parts not finished
  };
  // Copies the parts' done marks into the whole allreduce's (what the ring needs after a failure).
  void merge_done(const Split& s) const;
  // After a failure: throws SwitchLostError instead when one of the job's switches is gone.
  void blame_lost_switch();

  const PathContext& ctx_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::list<Split> splits_;
  std::vector<InPacket> in_;
  std::vector<AllreduceOp*> part_finished_;
  int64_t wait_ns_ = 0;
};

}  // namespace gradswitch::worker
