// Optimizer steps. The element loops are plain C++ that the compiler vectorises; target_clones
// builds an AVX-512, an AVX2 and a baseline version of each and picks one at load time.
#include "switch/engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gradswitch {

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(GS_NO_TARGET_CLONES)
#define GS_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GS_SIMD_CLONES
#endif

namespace {

struct Step {
  float lr, scale;  // scale: 1/world when averaging, else 1
  float wd;
};

// Every kernel reads the gradient from `io` and writes the new parameters there: the engine's
// result buffer holds the sum and then the parameters. Distinct restrict pointers let the loops
// vectorise without runtime alias checks (an aliased `out` and gradient made them fall back to
// scalar code).
GS_SIMD_CLONES void sgd_plain(float* __restrict p, float* __restrict io, size_t n, Step s) {
  for (size_t i = 0; i < n; ++i) {
    float grad = io[i] * s.scale + s.wd * p[i];
    p[i] -= s.lr * grad;
    io[i] = p[i];
  }
}

GS_SIMD_CLONES void sgd_momentum(float* __restrict p, float* __restrict buf, float* __restrict io, size_t n,
                                 Step s, float momentum, float dampening, bool nesterov, bool first) {
  for (size_t i = 0; i < n; ++i) {
    float grad = io[i] * s.scale + s.wd * p[i];
    float b = first ? grad : momentum * buf[i] + (1.0f - dampening) * grad;
    buf[i] = b;
    float d = nesterov ? grad + momentum * b : b;
    p[i] -= s.lr * d;
    io[i] = p[i];
  }
}

GS_SIMD_CLONES void adagrad(float* __restrict p, float* __restrict h, float* __restrict io, size_t n, Step s,
                            float eps, bool eps_inside) {
  for (size_t i = 0; i < n; ++i) {
    float grad = io[i] * s.scale + s.wd * p[i];
    float acc = h[i] + grad * grad;
    h[i] = acc;
    float denom = eps_inside ? std::sqrt(acc + eps) : std::sqrt(acc) + eps;
    p[i] -= s.lr * grad / denom;
    io[i] = p[i];
  }
}

GS_SIMD_CLONES void adam(float* __restrict p, float* __restrict m, float* __restrict v, float* __restrict io,
                         size_t n, Step s, float b1, float b2, float eps, float bc1, float bc2,
                         bool eps_inside, bool decoupled) {
  const float lr_t = s.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  for (size_t i = 0; i < n; ++i) {
    float param = p[i];
    float grad = io[i] * s.scale;
    if (decoupled)
      param *= 1.0f - s.lr * s.wd;
    else
      grad += s.wd * param;
    float mi = b1 * m[i] + (1.0f - b1) * grad;
    float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    // paper: lr * m_hat / sqrt(v_hat + eps);  torch: (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
    float denom = eps_inside ? std::sqrt(vi / bc2 + eps) : std::sqrt(vi) * inv_sqrt_bc2 + eps;
    param -= lr_t * mi / denom;
    p[i] = param;
    io[i] = param;
  }
}

GS_SIMD_CLONES void smorms3(float* __restrict p, float* __restrict sm, float* __restrict m,
                            float* __restrict v, float* __restrict io, size_t n, Step st, float eps) {
  for (size_t i = 0; i < n; ++i) {
    float grad = io[i] * st.scale + st.wd * p[i];
    float x_prev = m[i] * m[i] / (v[i] + eps);
    float s = 1.0f + (1.0f - x_prev) * sm[i];
    float rho = 1.0f / (s + 1.0f);
    float mi = (1.0f - rho) * m[i] + rho * grad;
    float vi = (1.0f - rho) * v[i] + rho * grad * grad;
    float x = mi * mi / (vi + eps);
    sm[i] = s;
    m[i] = mi;
    v[i] = vi;
    p[i] -= std::min(st.lr, x) / std::sqrt(vi + eps) * grad;
    io[i] = p[i];
  }
}

}  // namespace

const char* optimizer_algo_name(OptimizerAlgo a) {
  switch (a) {
    case OptimizerAlgo::kSgd:
      return "sgd";
    case OptimizerAlgo::kAdagrad:
      return "adagrad";
    case OptimizerAlgo::kAdam:
      return "adam";
    case OptimizerAlgo::kAdamW:
      return "adamw";
    case OptimizerAlgo::kSmorms3:
      return "smorms3";
  }
  return "unknown";
}

bool parse_optimizer_algo(const std::string& name, OptimizerAlgo* out) {
  for (auto a : {OptimizerAlgo::kSgd, OptimizerAlgo::kAdagrad, OptimizerAlgo::kAdam, OptimizerAlgo::kAdamW,
                 OptimizerAlgo::kSmorms3}) {
    if (name == optimizer_algo_name(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

unsigned optimizer_state_arrays(OptimizerAlgo a) {
  switch (a) {
    case OptimizerAlgo::kSgd:
      return 1;  // momentum buffer (unused without momentum)
    case OptimizerAlgo::kAdagrad:
      return 1;
    case OptimizerAlgo::kAdam:
    case OptimizerAlgo::kAdamW:
      return 2;
    case OptimizerAlgo::kSmorms3:
      return 3;
  }
  return 0;
}

size_t optimizer_memory_bytes(const OptimizerSpec& spec, uint32_t elements_per_chunk) {
  const size_t chunks = elements_per_chunk ? (spec.params + elements_per_chunk - 1) / elements_per_chunk : 0;
  return spec.params * 4 * (1 + optimizer_state_arrays(spec.algo)) + chunks * 4;
}

Optimizer::Optimizer(const OptimizerSpec& spec, uint32_t elements_per_chunk)
    : spec_(spec),
      elements_per_chunk_(elements_per_chunk),
      chunks_((spec.params + elements_per_chunk - 1) / elements_per_chunk),
      steps_(new uint32_t[chunks_]()),
      lr_(spec.lr) {
  const unsigned arrays = 1 + optimizer_state_arrays(spec.algo);
  for (unsigned a = 0; a < arrays; ++a) arrays_.emplace_back(new float[spec.params]());
  if (spec.algo == OptimizerAlgo::kAdagrad && spec.initial_accumulator != 0.0f)
    std::fill_n(state(0), spec.params, spec.initial_accumulator);
  if (spec.algo == OptimizerAlgo::kSmorms3) std::fill_n(state(0), spec.params, 1.0f);  // s_0 = 1
}

bool Optimizer::step(uint64_t offset, size_t n, const float* grad_sum, unsigned world, float* out) {
  if (offset > spec_.params || n > spec_.params - offset || offset % elements_per_chunk_ != 0) return false;
  uint32_t& t = steps_[offset / elements_per_chunk_];
  ++t;
  Step s{lr(), spec_.average && world ? 1.0f / static_cast<float>(world) : 1.0f, spec_.weight_decay};
  float* p = params() + offset;
  if (out != grad_sum) std::memmove(out, grad_sum, n * sizeof(float));  // the kernels work in place
  const bool eps_inside = spec_.eps_placement == EpsPlacement::kInsideSqrt;
  switch (spec_.algo) {
    case OptimizerAlgo::kSgd:
      if (spec_.momentum == 0.0f)
        sgd_plain(p, out, n, s);
      else
        sgd_momentum(p, state(0) + offset, out, n, s, spec_.momentum, spec_.dampening, spec_.nesterov,
                     t == 1);
      break;
    case OptimizerAlgo::kAdagrad:
      s.lr = s.lr / (1.0f + static_cast<float>(t - 1) * spec_.lr_decay);
      adagrad(p, state(0) + offset, out, n, s, spec_.eps, eps_inside);
      break;
    case OptimizerAlgo::kAdam:
    case OptimizerAlgo::kAdamW: {
      const float bc1 = 1.0f - std::pow(spec_.beta1, static_cast<float>(t));
      const float bc2 = 1.0f - std::pow(spec_.beta2, static_cast<float>(t));
      adam(p, state(0) + offset, state(1) + offset, out, n, s, spec_.beta1, spec_.beta2, spec_.eps, bc1, bc2,
           eps_inside, spec_.algo == OptimizerAlgo::kAdamW);
      break;
    }
    case OptimizerAlgo::kSmorms3:
      smorms3(p, state(0) + offset, state(1) + offset, state(2) + offset, out, n, s, spec_.eps);
      break;
  }
  return true;
}

}  // namespace gradswitch
