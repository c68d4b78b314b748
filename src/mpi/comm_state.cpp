// Per-communicator switch jobs and the in-order completion of their reductions (see comm_state.h).
#include "mpi/comm_state.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <random>

#include "gradswitch/wire.h"
#include "mpi/switch_call.h"
#include "worker/control.h"

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

// Waits for one of the helper's MPI requests, testing it with growing naps in between (20 us up to
// 1 ms) rather than in MPI's spinning wait: a rank done early leaves the (shared) cores to the ranks
// still receiving their sums. It costs the agreement at most about a millisecond.
void wait_napping(MPI_Request* request) {
  int flag = 0;
  for (auto nap = std::chrono::microseconds(20);; nap = std::min(nap * 2, std::chrono::microseconds(1000))) {
    PMPI_Test(request, &flag, MPI_STATUS_IGNORE);
    if (flag) return;
    std::this_thread::sleep_for(nap);
  }
}

}  // namespace

std::unique_ptr<CommState> CommState::create(MPI_Comm comm, bool can_use_switch, const Config& cfg,
                                             Tally& tally) {
  std::unique_ptr<CommState> s(new CommState(cfg, tally));
  PMPI_Comm_rank(comm, &s->rank_);
  PMPI_Comm_size(comm, &s->size_);
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
  // Native: MPI_DOUBLE travels as float64 on the float32 job, which the JOIN must list (types=).
  if (cfg.wire == FloatWire::kNative) o.types = "float64";
  o.timeout_s = cfg.timeout_s;
  std::string error;
  // A switch with an auth file: the tenant and secret from the environment (docs/security.md).
  if (worker::credentials_from_environment(&o.tenant, &o.secret, &error)) {
    try {
      s->group_ = worker::Group::connect(o);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  int vote = error.empty() ? INT_MAX : s->rank_, verdict = 0;
  PMPI_Allreduce(&vote, &verdict, 1, MPI_INT, MPI_MIN, s->private_);
  if (verdict != INT_MAX) {
    if (verdict == s->rank_)
      tally.warn("could not join a switch job for a communicator of " + std::to_string(s->size_) +
                 " ranks (its reductions stay with MPI): " + error);
    if (s->group_) s->group_->close();
    s->group_.reset();
    PMPI_Comm_free(&s->private_);
    return s;
  }
  s->job_ = name;
  s->helper_ = std::thread([p = s.get()] { p->helper_main(); });
  return s;
}

CommState::~CommState() {
  if (helper_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    helper_.join();  // after the queue drained
  }
  if (group_) {
    try {
      group_->close();
    } catch (...) {
    }
  }
  if (private_ != MPI_COMM_NULL) PMPI_Comm_free(&private_);
}

void CommState::enqueue(const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!group_closed_) {
    try {
      op->handle = start_switch(*group_, *op, cfg_.wire);
      op->submitted = true;
    } catch (const std::exception& e) {
      op->error = e.what();
    }
  }
  queue_.push_back(op);
  cv_.notify_all();
}

void CommState::wait(const Op& op) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return op.done; });
}

bool CommState::idle() {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.empty();
}

void CommState::helper_main() {
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      op = queue_.front();
    }
    finish(*op);
    tally_.done(*op);
    if (op->user_req != MPI_REQUEST_NULL) {
      PMPI_Grequest_complete(op->user_req);
      if (op->strict_error) PMPI_Comm_call_errhandler(op->comm, MPI_ERR_OTHER);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      op->done = true;
      queue_.pop_front();
    }
    cv_.notify_all();
  }
}

void CommState::finish(Op& op) {
  if (op.submitted) {
    try {
      op.handle.wait();
    } catch (const std::exception& e) {
      op.error = e.what();
    }
  }
  if (!failed_) {
    // Did every rank get its sum? One int, MPI_MIN: INT_MAX when all did, else the lowest failing rank.
    int vote = op.error.empty() ? INT_MAX : rank_, verdict = 0;
    MPI_Request req;
    PMPI_Iallreduce(&vote, &verdict, 1, MPI_INT, MPI_MIN, private_, &req);
    wait_napping(&req);
    if (verdict == INT_MAX) {
      op.by_switch = true;
      return;
    }
    if (verdict == rank_)
      tally_.warn("the switch failed during a reduction on job " + job_ + " (" + op.error + ")" +
                  (cfg_.strict ? "" : "; MPI redoes it and this communicator's later reductions"));
    // From this op on, MPI does this communicator's reductions, in the same order on every rank.
    // Without LEAVE: the switch aborts the job, so the other ranks' groups stop at once too.
    failed_ = true;
    {
      std::lock_guard<std::mutex> lk(mu_);
      group_closed_ = true;
    }
    group_->close(/*abort=*/true);
  }
  if (cfg_.strict)
    op.strict_error = true;
  else
    redo_by_mpi(op);
}

void CommState::redo_by_mpi(Op& op) {
  MPI_Request req;
  if (op.kind == Op::Kind::kReduce)
    PMPI_Ireduce(op.input, op.output, op.count, op.type, MPI_SUM, op.root, private_, &req);
  else
    PMPI_Iallreduce(op.input, op.output, op.count, op.type, MPI_SUM, private_, &req);
  wait_napping(&req);
}

}  // namespace gradswitch::mpi
