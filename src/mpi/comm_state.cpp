// Per-communicator switch jobs and the in-order progress of their reductions (see comm_state.h).
#include "mpi/comm_state.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <random>

#include "gradswitch/wire.h"
#include "mpi/counters.h"
#include "mpi/switch_call.h"

namespace gradswitch::mpi {

namespace {

// A job name and token nobody else picks: random from rank 0, shared by broadcast.
std::string random_hex() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^ (uint64_t(getpid()) << 16) ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::unique_ptr<CommState> CommState::create(MPI_Comm comm, bool can_use_switch, const Config& cfg,
                                             std::string* warning) {
  std::unique_ptr<CommState> s(new CommState);
  PMPI_Comm_rank(comm, &s->rank_);
  PMPI_Comm_size(comm, &s->size_);
  s->wire_ = cfg.wire;
  int mine = can_use_switch && s->size_ >= 2 && s->size_ <= static_cast<int>(GS_MAX_WORLD), all = 0;
  PMPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm);
  if (!all) return s;

  // From here on the library talks among the ranks on its own duplicate, so that its collectives
  // never interleave with the program's own on `comm`.
  PMPI_Comm_dup(comm, &s->private_);
  char ids[64] = {0};
  if (s->rank_ == 0) std::snprintf(ids, sizeof ids, "mpi-%s %s", random_hex().c_str(), random_hex().c_str());
  PMPI_Bcast(ids, sizeof ids, MPI_CHAR, 0, s->private_);
  std::string both(ids), name = both.substr(0, both.find(' ')), token = both.substr(both.find(' ') + 1);

  worker::Options o;
  o.switch_addr = cfg.switch_addr;
  o.job = name;
  o.token = token;
  o.rank = static_cast<unsigned>(s->rank_);
  o.world = static_cast<unsigned>(s->size_);
  o.wire = join_wire(cfg.wire);
  o.timeout_s = cfg.timeout_s;
  std::string error;
  try {
    s->group_ = worker::Group::connect(o);
  } catch (const std::exception& e) {
    error = e.what();
  }
  int vote = error.empty() ? INT_MAX : s->rank_, verdict = 0;
  PMPI_Allreduce(&vote, &verdict, 1, MPI_INT, MPI_MIN, s->private_);
  if (verdict != INT_MAX) {
    if (verdict == s->rank_)
      *warning = "could not join a switch job for a communicator of " + std::to_string(s->size_) +
                 " ranks (its reductions stay with MPI): " + error;
    if (s->group_) s->group_->close();
    s->group_.reset();
    PMPI_Comm_free(&s->private_);
    return s;
  }
  s->job_ = name;
  return s;
}

CommState::~CommState() {
  if (group_) {
    try {
      group_->close();
    } catch (...) {
    }
  }
  if (private_ != MPI_COMM_NULL) PMPI_Comm_free(&private_);
}

void CommState::enqueue(std::shared_ptr<Op> op) {
  if (!failed_) {
    op->handle = start_switch(*group_, *op, wire_);
    op->submitted = true;
  }
  queue_.push_back(std::move(op));
}

worker::Handle CommState::running_handle() const {
  for (const auto& op : queue_)
    if (op->stage == Op::Stage::kSwitch && op->submitted && !op->handle.done()) return op->handle;
  return worker::Handle();
}

void CommState::fail() {
  failed_ = true;
  // Without LEAVE: the switch aborts the job, so the other ranks' groups stop at once too.
  if (group_) group_->close(/*abort=*/true);
}

void CommState::start_fallback(Op& op) {
  if (op.kind == Op::Kind::kReduce)
    PMPI_Ireduce(op.input, op.output, op.count, op.type, MPI_SUM, op.root, private_, &op.mpi_req);
  else
    PMPI_Iallreduce(op.input, op.output, op.count, op.type, MPI_SUM, private_, &op.mpi_req);
  op.stage = Op::Stage::kFallback;
}

bool CommState::progress(const Config& cfg, Counters& counters, std::string* warning) {
  bool moved = false;
  while (!queue_.empty()) {
    Op& op = *queue_.front();
    if (op.stage == Op::Stage::kSwitch) {
      if (op.submitted) {
        if (!op.handle.done()) return moved;
        try {
          op.handle.wait();
        } catch (const std::exception& e) {
          op.error = e.what();
        }
        op.submitted = false;
      }
      moved = true;
      if (failed_) {
        // Every rank reaches this op after the same failed agreement: no need to ask again.
        if (cfg.strict) {
          op.strict_error = true;
          op.stage = Op::Stage::kDone;
        } else {
          start_fallback(op);
        }
      } else {
        op.vote = op.error.empty() ? INT_MAX : rank_;
        PMPI_Iallreduce(&op.vote, &op.verdict, 1, MPI_INT, MPI_MIN, private_, &op.mpi_req);
        op.stage = Op::Stage::kAgree;
      }
    }
    if (op.stage == Op::Stage::kAgree) {
      int flag = 0;
      PMPI_Test(&op.mpi_req, &flag, MPI_STATUS_IGNORE);
      if (!flag) return moved;
      moved = true;
      if (op.verdict == INT_MAX) {
        op.by_switch = true;
        op.stage = Op::Stage::kDone;
      } else {
        // A rank has no sum (the switch or the network failed during the reduction). From this op
        // on, MPI does this communicator's reductions, in the same order on every rank.
        if (op.verdict == rank_)
          *warning = "the switch failed during a reduction on job " + job_ + " (" + op.error + ")" +
                     (cfg.strict ? "" : "; MPI redoes it and this communicator's later reductions");
        fail();
        if (cfg.strict) {
          op.strict_error = true;
          op.stage = Op::Stage::kDone;
        } else {
          start_fallback(op);
        }
      }
    }
    if (op.stage == Op::Stage::kFallback) {
      int flag = 0;
      PMPI_Test(&op.mpi_req, &flag, MPI_STATUS_IGNORE);
      if (!flag) return moved;
      moved = true;
      op.stage = Op::Stage::kDone;
    }
    if (op.by_switch) {
      (op.kind == Op::Kind::kAllreduce ? counters.allreduce
       : op.kind == Op::Kind::kReduce  ? counters.reduce
                                       : counters.iallreduce)++;
      counters.switch_bytes += op.bytes();
    } else if (!op.strict_error) {
      counters.mpi_fallback++;
    }
    if (op.user_req != MPI_REQUEST_NULL) {
      PMPI_Grequest_complete(op.user_req);
      if (op.strict_error) PMPI_Comm_call_errhandler(op.comm, MPI_ERR_OTHER);
    }
    queue_.pop_front();
  }
  return moved;
}

}  // namespace gradswitch::mpi
