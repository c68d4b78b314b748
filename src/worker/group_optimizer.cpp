// A Group's optimizer-job requests (docs/optimizer.md): initial parameters, learning rate and
// checkpoints, each queued between two allreduces as the protocol requires.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gradswitch/control.h"
#include "worker/group.h"

namespace gradswitch::worker {

void Group::require_optimizer(const char* what) const {
  if (join_.optimizer.empty())
    throw InvalidArgument(std::string("gradswitch: ") + what + " needs an optimizer job, but " +
                          describe_job() + " was joined without optimizer=");
}

double Group::control_timeout(size_t bytes) const {
  // The request's own timeout plus the time to move the payload at a pessimistic 50 MB/s.
  return std::max(opt_.timeout_s, 10.0) + static_cast<double>(bytes) / 50e6;
}

namespace {
[[noreturn]] void throw_reply(const std::string& what, const std::string& job, const Reply& r) {
  std::string msg =
      "gradswitch: " + what + " of " + job + " refused by the switch: " + r.code + ": " + r.message;
  if (r.code == "bad_request" || r.code == "conflict") throw InvalidArgument(msg);
  throw Error(msg);
}
}  // namespace

Handle Group::upload_params_async(const float* data, size_t n) {
  require_optimizer("upload_params");
  if (opt_.rank != 0)
    throw InvalidArgument("gradswitch: upload_params is for rank 0 only (this is rank " +
                          std::to_string(opt_.rank) +
                          "): the switch takes the initial parameters from rank 0");
  if (n != join_.params)
    throw InvalidArgument("gradswitch: upload_params got " + std::to_string(n) + " values, but " +
                          describe_job() + " has params=" + std::to_string(join_.params));
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, data, n] {
    if (fatal_) std::rethrow_exception(fatal_);
    if (seq_ != 0)
      throw InvalidArgument("gradswitch: upload_params must come before the first allreduce of " +
                            describe_job() +
                            " (the switch may already have applied steps); use state_set to replace the "
                            "parameters and state later");
    // Little-endian float32 is the in-memory layout on every supported host (x86-64, aarch64).
    size_t bytes = n * sizeof(float);
    Reply r = parse_reply(control_->request_with_payload(
        GS_VERB_PARAMS " " GS_KEY_OFFSET "=0 " GS_KEY_COUNT "=" + std::to_string(n), data, bytes,
        control_timeout(bytes)));
    if (!r.ok) throw_reply(GS_VERB_PARAMS, describe_job(), r);
  };
  if (!control_) throw Error("gradswitch: upload_params needs a control connection");
  return enqueue(std::move(op));
}

float Group::set_lr(float lr) {
  require_optimizer("set_lr");
  if (!std::isfinite(lr) || lr < 0)
    throw InvalidArgument("gradswitch: set_lr needs a finite lr >= 0, got " + std::to_string(lr));
  if (!control_) throw Error("gradswitch: set_lr needs a control connection");
  auto stored = std::make_shared<float>(lr);
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, lr, stored] {
    if (fatal_) std::rethrow_exception(fatal_);
    Reply r = parse_reply(
        control_->request(GS_VERB_SETLR " " GS_KEY_LR "=" + format_float32(lr), control_timeout(0)));
    if (!r.ok) throw_reply(GS_VERB_SETLR, describe_job(), r);
    std::string v = r.get(GS_KEY_LR);
    if (!v.empty()) *stored = std::strtof(v.c_str(), nullptr);
  };
  enqueue(std::move(op)).wait();
  return *stored;
}

std::vector<uint8_t> Group::state_get() {
  require_optimizer("state_get");
  if (!control_) throw Error("gradswitch: state_get needs a control connection");
  auto out = std::make_shared<std::vector<uint8_t>>();
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, out] {
    // Allowed after a failed allreduce or an abort (e.g. to save what the switch holds).
    Reply r = parse_reply(control_->request_read_payload(GS_VERB_STATE_GET, GS_KEY_BYTES, out.get(),
                                                         control_timeout(join_.state_bytes)));
    if (!r.ok) throw_reply(GS_VERB_STATE_GET, describe_job(), r);
    if (out->size() != join_.state_bytes)
      throw Error("gradswitch: STATE_GET of " + describe_job() + " returned " + std::to_string(out->size()) +
                  " bytes, expected state_bytes=" + std::to_string(join_.state_bytes));
  };
  enqueue(std::move(op)).wait();
  return std::move(*out);
}

void Group::state_set(const uint8_t* data, size_t n) {
  require_optimizer("state_set");
  if (opt_.rank != 0)
    throw InvalidArgument("gradswitch: state_set is for rank 0 only (this is rank " +
                          std::to_string(opt_.rank) + ")");
  if (n != join_.state_bytes)
    throw InvalidArgument("gradswitch: state_set got a blob of " + std::to_string(n) + " bytes, but " +
                          describe_job() + " has state_bytes=" + std::to_string(join_.state_bytes) +
                          " (a checkpoint of a job with the same optimizer, params and --mtu is needed)");
  if (n < 8 || std::memcmp(data, GS_STATE_MAGIC, 8) != 0)
    throw InvalidArgument(
        "gradswitch: state_set: not a gradswitch optimizer checkpoint (magic GSOPTST1 missing)");
  if (!control_) throw Error("gradswitch: state_set needs a control connection");
  Op op{nullptr, 0, DType::kFloat32, nullptr, nullptr};
  op.fn = [this, data, n] {
    if (fatal_) std::rethrow_exception(fatal_);
    Reply r = parse_reply(control_->request_with_payload(
        GS_VERB_STATE_SET " " GS_KEY_BYTES "=" + std::to_string(n), data, n, control_timeout(n)));
    if (!r.ok) throw_reply(GS_VERB_STATE_SET, describe_job(), r);
  };
  enqueue(std::move(op)).wait();
}

}  // namespace gradswitch::worker
