// Parameter optimization inside the switch (paper 004, Algorithms 1-4, plus torch.optim options).
//
// An optimizer job's switch holds the fp32 parameters and the optimizer state. When a chunk's
// gradient sum completes, the owning data thread applies one step to that chunk's elements and
// the result packet carries the updated parameters. The shadow copy then holds those parameters,
// so a retransmission is answered without applying the step again.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradswitch/control.h"

namespace gradswitch {

// The values are the checkpoint blob's algorithm ids (include/gradswitch/control.h).
enum class OptimizerAlgo : uint8_t {
  kSgd = GS_OPT_SGD,
  kAdagrad = GS_OPT_ADAGRAD,
  kAdam = GS_OPT_ADAM,
  kAdamW = GS_OPT_ADAMW,
  kSmorms3 = GS_OPT_SMORMS3
};

// Where epsilon goes in AdaGrad and Adam: paper 004 writes sqrt(h + eps); torch.optim writes
// sqrt(h) + eps. The default follows the paper; `torch` mode matches torch.optim.
enum class EpsPlacement : uint8_t { kInsideSqrt, kOutsideSqrt };

struct OptimizerSpec {
  OptimizerAlgo algo = OptimizerAlgo::kSgd;
  uint64_t params = 0;  // number of fp32 parameters (the tensor's length)
  float lr = 0.01f;
  float momentum = 0.0f;               // SGD
  float dampening = 0.0f;              // SGD
  bool nesterov = false;               // SGD
  float weight_decay = 0.0f;           // SGD/AdaGrad/Adam: added to the gradient; AdamW: decoupled
  float beta1 = 0.9f, beta2 = 0.999f;  // Adam/AdamW
  float eps = 1e-8f;
  float lr_decay = 0.0f;             // AdaGrad (torch): lr / (1 + (t - 1) * lr_decay)
  float initial_accumulator = 0.0f;  // AdaGrad (torch)
  EpsPlacement eps_placement = EpsPlacement::kInsideSqrt;
  bool average = true;  // divide the gradient sum by the world size first
};

const char* optimizer_algo_name(OptimizerAlgo a);
bool parse_optimizer_algo(const std::string& name, OptimizerAlgo* out);
// fp32 state arrays per parameter (not counting the parameters themselves).
unsigned optimizer_state_arrays(OptimizerAlgo a);
// Bytes the switch holds for an optimizer job: parameters, state, per-chunk step counters.
size_t optimizer_memory_bytes(const OptimizerSpec& spec, uint32_t elements_per_chunk);

// The state of one job's optimizer. Data threads call step() on disjoint chunks (a chunk belongs
// to one slot, a slot to one thread); the control plane reads or writes the state only while the
// job is quiet (between steps), which the workers guarantee by protocol.
class Optimizer {
 public:
  Optimizer(const OptimizerSpec& spec, uint32_t elements_per_chunk);

  const OptimizerSpec& spec() const { return spec_; }
  // Schedulers change lr between steps. A worker sets it (and waits for the acknowledgement)
  // before it sends the next step's gradients, and no chunk completes without that worker's
  // contribution, so every chunk of a step sees the same lr.
  void set_lr(float lr) { lr_.store(lr, std::memory_order_release); }
  float lr() const { return lr_.load(std::memory_order_acquire); }

  // Applies one step to params[offset, offset + n) with the summed gradient `grad_sum`, writes the
  // new parameters to `out`. Returns false (nothing changed) when the range is out of bounds.
  bool step(uint64_t offset, size_t n, const float* grad_sum, unsigned world, float* out);

  // Checkpoint and restore: parameters, then each state array, then the step counters.
  float* params() { return arrays_[0].get(); }
  float* state(unsigned i) { return arrays_[1 + i].get(); }
  uint32_t* steps() { return steps_.get(); }
  size_t chunks() const { return chunks_; }

 private:
  OptimizerSpec spec_;
  uint32_t elements_per_chunk_;
  size_t chunks_;
  std::vector<std::unique_ptr<float[]>> arrays_;
  std::unique_ptr<uint32_t[]> steps_;  // updates applied per chunk: the t of Adam's bias correction
  std::atomic<float> lr_;
};

}  // namespace gradswitch
