// The switch's optimizers against straightforward double-precision transcriptions of paper 004's
// Algorithms 1-4 (and torch.optim's formulas), over 100 steps; and, through the engine, that a
// retransmission never applies a step twice.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/engine/engine.h"
#include "switch/engine/optimizer.h"

using namespace gradswitch;

namespace {

struct Reference {
  OptimizerSpec spec;
  std::vector<double> p, a, b, c;
  int t = 0;
  Reference(const OptimizerSpec& s, const std::vector<float>& init)
      : spec(s), p(init.begin(), init.end()), a(init.size()), b(init.size()), c(init.size(), 1.0) {
    if (s.algo == OptimizerAlgo::kAdagrad) std::fill(a.begin(), a.end(), s.initial_accumulator);
  }
  void step(const std::vector<double>& gsum, unsigned world) {
    ++t;
    const bool inside = spec.eps_placement == EpsPlacement::kInsideSqrt;
    for (size_t i = 0; i < p.size(); ++i) {
      double g = gsum[i] / (spec.average ? world : 1);
      switch (spec.algo) {
        case OptimizerAlgo::kSgd: {  // Algorithm 1, with torch's momentum/nesterov/weight decay
          g += spec.weight_decay * p[i];
          if (spec.momentum != 0) {
            a[i] = t == 1 ? g : spec.momentum * a[i] + (1 - spec.dampening) * g;
            g = spec.nesterov ? g + spec.momentum * a[i] : a[i];
          }
          p[i] -= spec.lr * g;
          break;
        }
        case OptimizerAlgo::kAdagrad: {  // Algorithm 2
          g += spec.weight_decay * p[i];
          a[i] += g * g;
          double lr = spec.lr / (1 + (t - 1) * spec.lr_decay);
          p[i] -= lr * g / (inside ? std::sqrt(a[i] + spec.eps) : std::sqrt(a[i]) + spec.eps);
          break;
        }
        case OptimizerAlgo::kAdam:
        case OptimizerAlgo::kAdamW: {  // Algorithm 3 (AdamW: decoupled weight decay)
          if (spec.algo == OptimizerAlgo::kAdamW)
            p[i] *= 1 - spec.lr * spec.weight_decay;
          else
            g += spec.weight_decay * p[i];
          a[i] = spec.beta1 * a[i] + (1 - spec.beta1) * g;
          b[i] = spec.beta2 * b[i] + (1 - spec.beta2) * g * g;
          double mh = a[i] / (1 - std::pow(double(spec.beta1), t)),
                 vh = b[i] / (1 - std::pow(double(spec.beta2), t));
          p[i] -= spec.lr * mh / (inside ? std::sqrt(vh + spec.eps) : std::sqrt(vh) + spec.eps);
          break;
        }
        case OptimizerAlgo::kSmorms3: {  // Algorithm 4 (a = m, b = v, c = s)
          double x_prev = a[i] * a[i] / (b[i] + spec.eps);
          c[i] = 1 + (1 - x_prev) * c[i];
          double rho = 1 / (c[i] + 1);
          a[i] = (1 - rho) * a[i] + rho * g;
          b[i] = (1 - rho) * b[i] + rho * g * g;
          double x = a[i] * a[i] / (b[i] + spec.eps);
          p[i] -= std::min(double(spec.lr), x) / std::sqrt(b[i] + spec.eps) * g;
          break;
        }
      }
    }
  }
};

double max_rel_error(const std::vector<double>& want, const float* got) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(want[i] - got[i]) / std::max(1e-3, std::fabs(want[i])));
  return worst;
}

void check_against_reference(OptimizerSpec spec, const char* label) {
  const size_t n = 1000;
  const uint32_t chunk = 360;
  spec.params = n;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> init(n);
  for (auto& x : init) x = d(rng);
  Optimizer opt(spec, chunk);
  std::memcpy(opt.params(), init.data(), n * 4);
  Reference ref(spec, init);
  std::vector<float> out(n);
  for (int step = 0; step < 100; ++step) {
    std::vector<float> g(n);
    for (auto& x : g) x = d(rng) * 0.1f;
    for (uint64_t off = 0; off < n; off += chunk) {
      size_t len = std::min<size_t>(chunk, n - off);
      CHECK(opt.step(off, len, g.data() + off, 3, out.data() + off));
    }
    ref.step(std::vector<double>(g.begin(), g.end()), 3);
  }
  double err = max_rel_error(ref.p, opt.params());
  std::printf("  %-34s max relative error after 100 steps: %.2e\n", label, err);
  CHECK(err < 1e-3);
  CHECK(std::memcmp(out.data(), opt.params(), n * 4) == 0);
}

}  // namespace

TEST(algorithms_match_the_reference) {
  OptimizerSpec s;
  s.lr = 0.05f;
  s.algo = OptimizerAlgo::kSgd;
  check_against_reference(s, "sgd (Algorithm 1)");
  s.momentum = 0.9f, s.weight_decay = 1e-2f, s.nesterov = true;
  check_against_reference(s, "sgd momentum+nesterov+wd");
  s = OptimizerSpec{};
  s.algo = OptimizerAlgo::kAdagrad, s.lr = 0.05f;
  check_against_reference(s, "adagrad (Algorithm 2)");
  s.eps_placement = EpsPlacement::kOutsideSqrt, s.lr_decay = 0.01f, s.initial_accumulator = 0.1f;
  check_against_reference(s, "adagrad (torch form)");
  s = OptimizerSpec{};
  s.algo = OptimizerAlgo::kAdam, s.lr = 1e-3f;
  check_against_reference(s, "adam (Algorithm 3)");
  s.eps_placement = EpsPlacement::kOutsideSqrt, s.weight_decay = 1e-2f;
  check_against_reference(s, "adam (torch form, wd)");
  s.algo = OptimizerAlgo::kAdamW;
  check_against_reference(s, "adamw");
  s = OptimizerSpec{};
  s.algo = OptimizerAlgo::kSmorms3, s.lr = 1e-3f;
  check_against_reference(s, "smorms3 (Algorithm 4)");
}

TEST(out_of_range_chunks_are_refused) {
  OptimizerSpec s;
  s.params = 100;
  Optimizer opt(s, 40);
  float g[40] = {}, out[40];
  CHECK(!opt.step(80, 40, g, 1, out));  // past the end
  CHECK(!opt.step(20, 10, g, 1, out));  // not on a chunk boundary
  CHECK(opt.step(80, 20, g, 1, out));
}

TEST(engine_retransmission_never_applies_a_step_twice) {
  Engine engine(EngineConfig{1, 2});
  auto spec_opt = std::make_shared<OptimizerSpec>();
  spec_opt->algo = OptimizerAlgo::kSgd;
  spec_opt->lr = 1.0f;
  spec_opt->params = 4;
  spec_opt->average = false;
  JobSpec spec;
  spec.world = 2;
  spec.endpoints.resize(2);
  spec.optimizer = spec_opt;
  spec.payload_bytes = 64;
  std::string err;
  uint32_t id = engine.create_job(spec, &err);
  CHECK(id != 0);
  Optimizer* opt = engine.job_optimizer(id);
  CHECK(opt != nullptr);
  for (int i = 0; i < 4; ++i) opt->params()[i] = 10.0f;
  auto packet = [&](uint16_t rank, float g) {
    std::vector<uint8_t> p(GS_HEADER_BYTES + 16);
    HeaderBuilder(GS_MSG_DATA, id, 0).rank(rank).elems(GS_ELEM_FLOAT32, 4).exps(0, 0).encode(p.data());
    float v[4] = {g, g, g, g};
    std::memcpy(p.data() + GS_HEADER_BYTES, v, 16);
    return p;
  };
  auto a = packet(0, 1.0f), b = packet(1, 2.0f);
  engine.ingest(0, a.data(), a.size(), 1, Endpoint{});
  IngestResult r = engine.ingest(0, b.data(), b.size(), 1, Endpoint{});
  float out[4];
  std::memcpy(out, r.data + GS_HEADER_BYTES, 16);
  CHECK(r.kind == IngestResult::kSend && out[0] == 7.0f);  // 10 - 1.0 * (1 + 2)
  b[offsetof(gs_header, flags)] |= GS_FLAG_RETX;
  r = engine.ingest(0, b.data(), b.size(), 1, Endpoint{});  // retransmission
  std::memcpy(out, r.data + GS_HEADER_BYTES, 16);
  CHECK(r.dest_rank == 1 && out[3] == 7.0f && opt->params()[0] == 7.0f);
  auto bad = packet(0, 1.0f);
  bad[17] = GS_ELEM_INT32;
  CHECK(engine.ingest(0, bad.data(), bad.size(), 1, Endpoint{}).reason == DropReason::kBadElemType);
}

GS_TEST_MAIN()
