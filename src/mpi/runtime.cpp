// Process-wide state of the MPI library and the two ways a reduction runs (see runtime.h).
#include "mpi/runtime.h"

#include <sched.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "mpi/datatypes.h"
#include "mpi/switch_call.h"
#include "worker/control.h"

namespace gradswitch::mpi {

namespace {

// Attribute delete callback: the program freed a communicator (or MPI_Finalize frees them).
int forget_comm(MPI_Comm comm, int, void* state, void*) {
  Runtime::get().forget(comm, static_cast<CommState*>(state));
  return MPI_SUCCESS;
}

// Generalized-request callbacks: a completed MPI_Iallreduce has no source, tag or elements.
int query_request(void*, MPI_Status* status) {
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  return MPI_SUCCESS;
}
int free_request(void*) {
  return MPI_SUCCESS;
}
int cancel_request(void*, int) {
  return MPI_SUCCESS;
}  // a reduction cannot be taken back: it completes

// "" when the switch's control plane answers PING, else why not.
std::string probe(const std::string& addr, double timeout_s) {
  try {
    std::string host;
    uint16_t port = 0;
    worker::split_host_port(addr, &host, &port);
    worker::ControlClient client(host, port, timeout_s);
    worker::Reply r = worker::parse_reply(client.request("PING", timeout_s));
    if (!r.ok) return "the switch at " + addr + " refused PING: " + r.line;
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

Runtime& Runtime::get() {
  static Runtime* rt = new Runtime;  // never destroyed: MPI may call back during exit
  return *rt;
}

int Runtime::on_init() {
  std::lock_guard<std::mutex> lk(mu_);
  PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  cfg_ = config_from_env();
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, forget_comm, &keyval_, nullptr);
  std::string why = cfg_.problem;
  if (why.empty() && cfg_.switch_addr.empty()) why = "GRADSWITCH_SWITCH is not set (host:port of the switch)";
  if (why.empty()) why = probe(cfg_.switch_addr, 5.0);
  // Every rank must agree, or a communicator's ranks would take different paths.
  int vote = why.empty() ? INT_MAX : world_rank_, verdict = 0;
  PMPI_Allreduce(&vote, &verdict, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  active_ = verdict == INT_MAX;
  if (active_) return MPI_SUCCESS;
  if (cfg_.strict) {
    if (verdict == world_rank_)
      std::fprintf(stderr, "gradswitch-mpi: rank %d: error (GRADSWITCH_MPI_STRICT=1): %s\n", world_rank_,
                   why.c_str());
    PMPI_Comm_call_errhandler(MPI_COMM_WORLD, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
  }
  if (verdict == world_rank_) report(why + "; every reduction uses MPI");
  return MPI_SUCCESS;
}

void Runtime::report(const std::string& warning) {
  if (cfg_.strict) {
    std::fprintf(stderr, "gradswitch-mpi: rank %d: error (GRADSWITCH_MPI_STRICT=1): %s\n", world_rank_,
                 warning.c_str());
    return;
  }
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr, "gradswitch-mpi: rank %d: warning: %s\n", world_rank_, warning.c_str());
}

CommState* Runtime::route(const Call& c) {
  std::lock_guard<std::mutex> lk(mu_);
  if (keyval_ == MPI_KEYVAL_INVALID || finalized_) return nullptr;  // MPI_Init did not come through here
  const Elem e = classify(c.type);
  int inter = 0;
  if (c.op != MPI_SUM || e == Elem::kNone || c.count <= 0 || c.comm == MPI_COMM_NULL ||
      PMPI_Comm_test_inter(c.comm, &inter) != MPI_SUCCESS || inter) {
    counters_.mpi_other++;
    return nullptr;
  }
  if (static_cast<size_t>(c.count) * elem_bytes(e) < cfg_.min_bytes) {
    counters_.mpi_small++;
    return nullptr;
  }
  if (!active_) {
    counters_.mpi_no_switch++;
    return nullptr;
  }
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(c.comm, keyval_, &attr, &found);
  CommState* cs = found ? static_cast<CommState*>(attr) : nullptr;
  if (!cs) {
    std::string warning;
    comms_.push_back(CommState::create(c.comm, active_, cfg_, &warning));
    cs = comms_.back().get();
    PMPI_Comm_set_attr(c.comm, keyval_, cs);
    if (!warning.empty()) report(warning);
    if (cs->uses_switch()) {
      counters_.jobs++;
      if (cfg_.verbose)
        std::fprintf(stderr, "gradswitch-mpi: rank %d: joined switch job %s (%d ranks, rank %d)\n",
                     world_rank_, cs->job().c_str(), cs->size(), cs->rank());
    }
  }
  if (!cs->uses_switch()) {
    counters_.mpi_no_switch++;
    return nullptr;
  }
  return cs;
}

std::shared_ptr<Op> Runtime::make_op(const Call& c) {
  auto op = std::make_shared<Op>();
  op->kind = c.kind;
  op->comm = c.comm;
  op->count = c.count;
  op->type = c.type;
  op->root = c.root;
  op->elem = classify(c.type);
  int rank = 0;
  PMPI_Comm_rank(c.comm, &rank);
  const bool gets_sum = c.kind != Op::Kind::kReduce || rank == c.root;
  if (c.sendbuf == MPI_IN_PLACE && gets_sum) {
    // The buffer is both contribution and result: keep the contribution for a fallback.
    const auto* p = static_cast<const uint8_t*>(c.recvbuf);
    op->saved.assign(p, p + op->bytes());
    op->input = op->saved.data();
  } else {
    op->input = c.sendbuf;
  }
  op->output = gets_sum ? c.recvbuf : nullptr;
  return op;
}

bool Runtime::progress_locked() {
  bool moved = false;
  std::string warning;
  for (auto& cs : comms_) {
    moved |= cs->progress(cfg_, counters_, &warning);
    if (!warning.empty()) report(warning), warning.clear();
  }
  for (auto it = requests_.begin(); it != requests_.end();)
    it = it->second->stage == Op::Stage::kDone ? requests_.erase(it) : std::next(it);
  for (auto it = comms_.begin(); it != comms_.end();)
    it = (*it)->freed && (*it)->idle() ? comms_.erase(it) : std::next(it);
  return moved;
}

worker::Handle Runtime::running_locked() {
  for (auto& cs : comms_) {
    worker::Handle h = cs->running_handle();
    if (!h.done()) return h;
  }
  return worker::Handle();
}

void Runtime::sleep_on(const worker::Handle& running) {
  // On a running switch part, sleep until it finishes (briefly: MPI requests may need polling
  // meanwhile); with only MPI requests in flight, poll them again soon.
  if (!running.done())
    running.wait_for(0.0005);
  else
    sched_yield();
}

void Runtime::wait_op(const std::shared_ptr<Op>& op, std::unique_lock<std::mutex>& lk) {
  while (op->stage != Op::Stage::kDone) {
    if (progress_locked()) continue;
    worker::Handle running = running_locked();
    lk.unlock();
    sleep_on(running);
    lk.lock();
  }
}

int Runtime::run_blocking(CommState& cs, const Call& c) {
  std::unique_lock<std::mutex> lk(mu_);
  auto op = make_op(c);
  cs.enqueue(op);
  wait_op(op, lk);
  if (op->strict_error) {
    lk.unlock();
    PMPI_Comm_call_errhandler(c.comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
  }
  return MPI_SUCCESS;
}

int Runtime::start(CommState& cs, const Call& c, MPI_Request* request) {
  std::lock_guard<std::mutex> lk(mu_);
  auto op = make_op(c);
  int rc = PMPI_Grequest_start(query_request, free_request, cancel_request, nullptr, &op->user_req);
  if (rc != MPI_SUCCESS) return rc;
  requests_[op->user_req] = op;
  cs.enqueue(op);
  *request = op->user_req;
  return MPI_SUCCESS;
}

bool Runtime::busy() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& cs : comms_)
    if (!cs->idle()) return true;
  return false;
}

bool Runtime::progress_all() {
  std::lock_guard<std::mutex> lk(mu_);
  return progress_locked();
}

void Runtime::idle() {
  worker::Handle running;
  {
    std::lock_guard<std::mutex> lk(mu_);
    running = running_locked();
  }
  sleep_on(running);
}

bool Runtime::owns(MPI_Request request) {
  std::lock_guard<std::mutex> lk(mu_);
  return request != MPI_REQUEST_NULL && requests_.count(request);
}

void Runtime::wait_owned(MPI_Request request) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  std::shared_ptr<Op> op = it->second;
  wait_op(op, lk);
}

void Runtime::forget(MPI_Comm, CommState* state) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& cs : comms_)
    if (cs.get() == state) cs->freed = true;  // destroyed (job left) once its queue drains
}

void Runtime::on_finalize() {
  std::unique_lock<std::mutex> lk(mu_);
  if (finalized_ || keyval_ == MPI_KEYVAL_INVALID) return;
  // Reductions the program started and never waited for still complete on every rank.
  for (;;) {
    bool pending = false;
    for (auto& cs : comms_) pending |= !cs->idle();
    if (!pending) break;
    if (!progress_locked()) {
      worker::Handle running = running_locked();
      lk.unlock();
      sleep_on(running);
      lk.lock();
    }
  }
  comms_.clear();  // leaves every switch job, frees the private communicators
  requests_.clear();
  finalized_ = true;
  write_stats();
}

std::string Runtime::stats_json() {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_.json(world_rank_);
}

void Runtime::write_stats() {
  if (cfg_.stats.empty() || cfg_.stats == "0") return;
  if (cfg_.stats == "1") {
    std::fprintf(stderr, "gradswitch-mpi: %s\n", counters_.text(world_rank_, cfg_.min_bytes).c_str());
    return;
  }
  std::string path = cfg_.stats + "." + std::to_string(world_rank_) + ".json";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%s\n", counters_.json(world_rank_).c_str());
    std::fclose(f);
  } else {
    std::fprintf(stderr, "gradswitch-mpi: rank %d: cannot write GRADSWITCH_MPI_STATS file %s: %s\n",
                 world_rank_, path.c_str(), std::strerror(errno));
  }
}

}  // namespace gradswitch::mpi
