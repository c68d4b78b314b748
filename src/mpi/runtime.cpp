// Process-wide state of the MPI library and running a reduction through the switch (see runtime.h).
#include "mpi/runtime.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "mpi/datatypes.h"
#include "worker/control.h"
#include "worker/group.h"

namespace gradswitch::mpi {

namespace {

// Attribute delete callback: the program freed a communicator (or MPI_Finalize frees them).
int forget_comm(MPI_Comm, int, void* state, void*) {
  Runtime::get().forget(static_cast<CommState*>(state));
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

// "" when the control plane of every switch of the list answers PING, else why not.
std::string probe(const std::string& addrs, double timeout_s) {
  for (const std::string& addr : worker::switch_list(addrs)) {  // every switch of a sharded job
    try {
      std::string host;
      uint16_t port = 0;
      worker::split_host_port(addr, &host, &port);
      worker::ControlClient client(host, port, timeout_s);
      worker::Reply r = worker::parse_reply(client.request("PING", timeout_s));
      if (!r.ok) return "the switch at " + addr + " refused PING: " + r.line;
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  return "";
}

}  // namespace

Runtime& Runtime::get() {
  static Runtime* rt = new Runtime;  // never destroyed: MPI may call back during exit
  return *rt;
}

int Runtime::thread_level_for(int requested) {
  std::lock_guard<std::mutex> lk(mu_);
  cfg_ = config_from_env();
  program_level_ = requested;
  // Only a library that will try the switch needs the helper threads' MPI_THREAD_MULTIPLE.
  return cfg_.problem.empty() && !cfg_.switch_addr.empty() ? MPI_THREAD_MULTIPLE : requested;
}

int Runtime::on_init(int provided) {
  std::lock_guard<std::mutex> lk(mu_);
  int world_rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  tally_.set_rank(world_rank, cfg_.strict);
  program_level_ = std::min(program_level_, provided);
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, forget_comm, &keyval_, nullptr);
  std::string why = cfg_.problem;
  if (why.empty() && cfg_.switch_addr.empty()) why = "GRADSWITCH_SWITCH is not set (host:port of the switch)";
  if (why.empty() && provided < MPI_THREAD_MULTIPLE)
    why = "this MPI does not provide MPI_THREAD_MULTIPLE, which the library's helper threads need";
  if (why.empty()) why = probe(cfg_.switch_addr, 5.0);
  // Every rank must agree, or a communicator's ranks would take different paths.
  int vote = why.empty() ? INT_MAX : world_rank, verdict = 0;
  PMPI_Allreduce(&vote, &verdict, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  active_ = verdict == INT_MAX;
  if (active_) return MPI_SUCCESS;
  if (verdict == world_rank) tally_.warn(why + (cfg_.strict ? "" : "; every reduction uses MPI"));
  if (!cfg_.strict) return MPI_SUCCESS;
  PMPI_Comm_call_errhandler(MPI_COMM_WORLD, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

CommState* Runtime::route(const Call& c) {
  std::unique_lock<std::mutex> lk(mu_);
  if (keyval_ == MPI_KEYVAL_INVALID || finalized_) return nullptr;  // MPI_Init did not come through here
  retire_freed();
  const Elem e = classify(c.type);
  int inter = 0;
  if (c.op != MPI_SUM || e == Elem::kNone || c.count <= 0 || c.comm == MPI_COMM_NULL ||
      PMPI_Comm_test_inter(c.comm, &inter) != MPI_SUCCESS || inter) {
    tally_.bump(&Counters::mpi_other);
    return nullptr;
  }
  if (static_cast<size_t>(c.count) * elem_bytes(e) < cfg_.min_bytes) {
    tally_.bump(&Counters::mpi_small);
    return nullptr;
  }
  if (!active_) {
    tally_.bump(&Counters::mpi_no_switch);
    return nullptr;
  }
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(c.comm, keyval_, &attr, &found);
  CommState* cs = found ? static_cast<CommState*>(attr) : nullptr;
  if (!cs) {
    // Collective over c.comm, so made without the lock: in an MPI_THREAD_MULTIPLE program another
    // thread's first reduction on another communicator may be the one the other ranks make first,
    // and must not wait behind this one. (MPI forbids two threads' collectives on one communicator
    // at once, so no other thread creates this communicator's state meanwhile.)
    lk.unlock();
    std::unique_ptr<CommState> created = CommState::create(c.comm, true, cfg_, tally_);
    lk.lock();
    comms_.push_back(std::move(created));
    cs = comms_.back().get();
    PMPI_Comm_set_attr(c.comm, keyval_, cs);
    if (cs->uses_switch()) {
      tally_.bump(&Counters::jobs);
      if (cfg_.verbose)
        std::fprintf(stderr, "gradswitch-mpi: rank %d: joined switch job %s (%d ranks, rank %d)\n",
                     tally_.world_rank(), cs->job().c_str(), cs->size(), cs->rank());
    }
  }
  if (!cs->uses_switch()) {
    tally_.bump(&Counters::mpi_no_switch);
    return nullptr;
  }
  return cs;
}

std::shared_ptr<Op> Runtime::make_op(const CommState& cs, const Call& c) {
  auto op = std::make_shared<Op>();
  op->kind = c.kind;
  op->comm = c.comm;
  op->count = c.count;
  op->type = c.type;
  op->root = c.root;
  op->elem = classify(c.type);
  const bool gets_sum = c.kind != Op::Kind::kReduce || cs.rank() == c.root;
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

int Runtime::run_blocking(CommState& cs, const Call& c) {
  auto op = make_op(cs, c);
  cs.enqueue(op);
  cs.wait(*op);
  if (!op->strict_error) return MPI_SUCCESS;
  PMPI_Comm_call_errhandler(c.comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

int Runtime::start(CommState& cs, const Call& c, MPI_Request* request) {
  auto op = make_op(cs, c);
  int rc = PMPI_Grequest_start(query_request, free_request, cancel_request, nullptr, &op->user_req);
  if (rc != MPI_SUCCESS) return rc;
  *request = op->user_req;
  cs.enqueue(op);
  return MPI_SUCCESS;
}

void Runtime::forget(CommState* state) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& cs : comms_)
    if (cs.get() == state) cs->freed = true;
}

void Runtime::retire_freed() {
  // Destroyed here, in a program thread, not in the attribute callback: leaving the job and freeing
  // the private communicator are MPI and network calls.
  for (auto it = comms_.begin(); it != comms_.end();)
    it = (*it)->freed && (*it)->idle() ? comms_.erase(it) : std::next(it);
}

void Runtime::on_finalize() {
  std::lock_guard<std::mutex> lk(mu_);
  if (finalized_ || keyval_ == MPI_KEYVAL_INVALID) return;
  // Reductions the program started and never waited for still complete (on every rank): each
  // communicator's destructor drains its queue, leaves its job and frees its private communicator.
  comms_.clear();
  finalized_ = true;
  write_stats();
}

std::string Runtime::stats_json() {
  return tally_.snapshot().json(tally_.world_rank());
}

void Runtime::write_stats() {
  if (cfg_.stats.empty() || cfg_.stats == "0") return;
  const Counters c = tally_.snapshot();
  const int rank = tally_.world_rank();
  if (cfg_.stats == "1") {
    std::fprintf(stderr, "gradswitch-mpi: %s\n", c.text(rank, cfg_.min_bytes).c_str());
    return;
  }
  std::string path = cfg_.stats + "." + std::to_string(rank) + ".json";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%s\n", c.json(rank).c_str());
    std::fclose(f);
  } else {
    std::fprintf(stderr, "gradswitch-mpi: rank %d: cannot write GRADSWITCH_MPI_STATS file %s: %s\n", rank,
                 path.c_str(), std::strerror(errno));
  }
}

}  // namespace gradswitch::mpi
