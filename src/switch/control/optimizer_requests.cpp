// Requests of optimizer jobs (see optimizer_requests.h): PARAMS, STATE_SET, SETLR and STATE_GET.
#include "switch/control/optimizer_requests.h"

#include <atomic>
#include <bit>

namespace gradswitch::control {

// The state blob is the switch's memory as it is: little-endian floats and counters.
static_assert(std::endian::native == std::endian::little,
              "the STATE_GET/STATE_SET layout assumes little-endian");

OptimizerRequests::OptimizerRequests(Engine& engine, const SwitchConfig& config, Connections& conns)
    : engine_(engine), config_(config), conns_(conns) {}

Optimizer* OptimizerRequests::joined_optimizer(Conn& c, const std::string& verb, Error* err) {
  if (c.role != Conn::Role::kJoined) {
    *err = {kErrState,
            verb + " needs a connection that has joined an optimizer job (JOIN ... optimizer=...)"};
    return nullptr;
  }
  Optimizer* opt = engine_.job_optimizer(c.job_id);
  if (!opt && !config_.uplink.empty()) {  // a leaf
    *err = {kErrState, "job '" + c.job_name + "' runs through this leaf switch, whose spine (" +
                           config_.uplink + ") holds the parameters and optimizes; " + verb +
                           " is not relayed to the spine: the parameters start as zeros there"};
    return nullptr;
  }
  if (!opt) {
    *err = {kErrState,
            "job '" + c.job_name + "' does not optimize in the switch (it was joined without optimizer=)"};
    return nullptr;
  }
  return opt;
}

void OptimizerRequests::handle_upload(Conn& c, const Request& r) {
  auto length = binary_length(r);
  if (!length)
    return conns_.close_with_error(
        c, kErrBadRequest,
        r.verb + (r.verb == GS_VERB_PARAMS ? " needs count=<0..4294967295>" : " needs bytes=<n>") +
            ": the length of the payload that follows is unknown; closing the connection");
  c.bin = plan_upload(c, r, *length);
  // The dispatcher feeds it from the bytes already buffered and those still to come.
}

Conn::BinaryIn OptimizerRequests::plan_upload(Conn& c, const Request& r, uint64_t total) {
  Conn::BinaryIn b;
  b.total = total;
  b.job_id = c.job_id;
  Error err;
  Optimizer* opt = joined_optimizer(c, r.verb, &err);
  if (opt && c.rank != 0) {
    err = {kErrState, r.verb + " is rank 0's (this connection is rank " + std::to_string(c.rank) + ")"};
    opt = nullptr;
  }
  if (opt && r.verb == GS_VERB_PARAMS) {
    auto p = parse_params(r, &err);
    if (!p) {
      opt = nullptr;
    } else if (p->offset + p->count > opt->spec().params) {
      err = {kErrBadRequest, "offset=" + std::to_string(p->offset) + " count=" + std::to_string(p->count) +
                                 " is beyond the job's " + std::to_string(opt->spec().params) +
                                 " parameters"};
      opt = nullptr;
    } else {
      b.kind = Conn::BinaryIn::kParams;
      b.param_offset = p->offset;
      b.ok = GS_REPLY_OK "\n";
    }
  } else if (opt) {
    auto bytes = parse_state_set(r, &err);
    const uint32_t chunk = config_.payload_bytes() / 4;
    b.expect = state_header_for(opt->spec(), chunk, opt->lr());
    if (!bytes) {
      opt = nullptr;
    } else if (*bytes != state_blob_bytes(b.expect)) {
      err = {kErrConflict, "STATE_SET bytes=" + std::to_string(*bytes) +
                               " does not fit this job: its state is " +
                               std::to_string(state_blob_bytes(b.expect)) + " bytes"};
      opt = nullptr;
    } else {
      b.kind = Conn::BinaryIn::kState;
      b.ok = GS_REPLY_OK "\n";
    }
  }
  if (!opt) {
    b.kind = Conn::BinaryIn::kDiscard;
    b.error = err;
  }
  return b;
}

size_t OptimizerRequests::take_state(Conn& c, Optimizer* opt, size_t want) {
  Conn::BinaryIn& b = *c.bin;
  if (b.done < kStateHeaderBytes) {
    want = std::min<size_t>(want, kStateHeaderBytes - b.done);
    c.in.take(reinterpret_cast<char*>(b.header) + b.done, want);
    if (b.done + want == kStateHeaderBytes) {
      Error err;
      if (auto decoded = decode_state_header(b.header, b.expect, &err)) {
        b.expect = *decoded;  // what it said: the job's layout, and the lr to set at the end
      } else {
        b.kind = Conn::BinaryIn::kDiscard;
        b.error = err;
      }
    }
    return want;
  }
  const uint64_t array_bytes = b.expect.params * 4;
  const uint64_t pos = b.done - kStateHeaderBytes;
  const uint64_t a = pos / array_bytes;
  char* dst;
  uint64_t room;
  if (a < b.expect.arrays) {
    float* arr = a == 0 ? opt->params() : opt->state(static_cast<unsigned>(a - 1));
    dst = reinterpret_cast<char*>(arr) + (pos - a * array_bytes);
    room = array_bytes - (pos - a * array_bytes);
  } else {
    const uint64_t off = pos - b.expect.arrays * array_bytes;
    dst = reinterpret_cast<char*>(opt->steps()) + off;
    room = uint64_t{b.expect.chunks} * 4 - off;
  }
  want = static_cast<size_t>(std::min<uint64_t>(want, room));
  c.in.take(dst, want);
  return want;
}

void OptimizerRequests::feed(Conn& c) {
  Conn::BinaryIn& b = *c.bin;
  while (b.done < b.total) {
    const size_t avail = c.in.buffered();
    if (avail == 0) return;
    size_t want = static_cast<size_t>(std::min<uint64_t>(avail, b.total - b.done));
    Optimizer* opt = b.kind == Conn::BinaryIn::kDiscard ? nullptr : engine_.job_optimizer(b.job_id);
    if (!opt && b.kind != Conn::BinaryIn::kDiscard) {  // cannot happen while joined; be safe
      b.kind = Conn::BinaryIn::kDiscard;
      b.error = {kErrState, "the job ended during the upload"};
    }
    if (b.kind == Conn::BinaryIn::kDiscard)
      c.in.take(nullptr, want);
    else if (b.kind == Conn::BinaryIn::kParams)
      c.in.take(reinterpret_cast<char*>(opt->params() + b.param_offset) + b.done, want);
    else
      want = take_state(c, opt, want);
    b.done += want;
  }
  finish_upload(c);
}

void OptimizerRequests::finish_upload(Conn& c) {
  Conn::BinaryIn& b = *c.bin;
  if (b.kind == Conn::BinaryIn::kState)
    if (Optimizer* opt = engine_.job_optimizer(b.job_id)) opt->set_lr(b.expect.lr);
  // The data threads read what was written only after this reply reached rank 0 (a step needs its
  // next DATA packet); the fence orders the writes before the reply's send().
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Conn::BinaryIn done = std::move(b);
  c.bin.reset();
  if (done.kind == Conn::BinaryIn::kDiscard)
    conns_.reply_error(c, done.error.code, done.error.message);
  else
    conns_.reply(c, done.ok);
}

void OptimizerRequests::handle_setlr(Conn& c, const Request& r) {
  Error err;
  auto lr = parse_setlr(r, &err);
  if (!lr) return conns_.reply_error(c, err.code, err.message);
  Optimizer* opt = joined_optimizer(c, GS_VERB_SETLR, &err);
  if (!opt) return conns_.reply_error(c, err.code, err.message);
  opt->set_lr(*lr);
  conns_.reply(c, Line(GS_REPLY_OK).add(GS_KEY_LR, format_float(*lr)).str());
}

void OptimizerRequests::handle_state_get(Conn& c, const Request& r) {
  Error err;
  if (!parse_no_args(r, &err)) return conns_.reply_error(c, err.code, err.message);
  Optimizer* opt = joined_optimizer(c, GS_VERB_STATE_GET, &err);
  if (!opt) return conns_.reply_error(c, err.code, err.message);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const StateHeader h = state_header_for(opt->spec(), config_.payload_bytes() / 4, opt->lr());
  const uint64_t bytes = state_blob_bytes(h);
  std::string line = Line(GS_REPLY_OK)
                         .add(GS_KEY_BYTES, bytes)
                         .add(GS_KEY_ALGO, optimizer_algo_name(opt->spec().algo))
                         .add(GS_KEY_PARAMS, h.params)
                         .add(GS_KEY_ARRAYS, h.arrays)
                         .add(GS_KEY_CHUNK, h.chunk)
                         .add(GS_KEY_CHUNKS, h.chunks)
                         .add(GS_KEY_LR, format_float(h.lr))
                         .str();
  uint8_t header[kStateHeaderBytes];
  encode_state_header(h, header);
  line.append(reinterpret_cast<const char*>(header), sizeof header);
  for (unsigned a = 0; a < h.arrays; ++a) {
    Conn::Segment s;
    s.borrowed = reinterpret_cast<const uint8_t*>(a == 0 ? opt->params() : opt->state(a - 1));
    s.len = h.params * 4;
    c.stream.push_back(std::move(s));
  }
  Conn::Segment steps;
  steps.owned.assign(reinterpret_cast<const char*>(opt->steps()), size_t{h.chunks} * 4);
  steps.len = steps.owned.size();
  c.stream.push_back(std::move(steps));
  conns_.reply(c, line);  // sends the line, the header and then the stream as the peer reads
}

}  // namespace gradswitch::control
