// The switch's optimizer kernels alone (paper 004 Fig. 17): one optimizer step over N parameters,
// applied chunk by chunk exactly as the data threads do at chunk completion, per algorithm, on one
// core; and their memory throughput next to this machine's memory bandwidth.
//
//   build/bench/optimizer_step [--params 800000] [--large 33554432] [--seconds 1] [--workers 2]
//
// "bytes/elem" is what the kernel must move per parameter (read the gradient sum, read and write
// the parameter and each state array, write the result): sgd 16, sgd+momentum 24, adagrad 24,
// adam/adamw 32, smorms3 40. Throughput = bytes/elem * params / time. The bandwidth reference is
// STREAM-style on one core: copy (read + write counted) and triad-like "scale" a[i] = b[i] * s + a[i]
// (two reads, one write), on buffers far larger than the caches.
//
// Last, the engine's whole per-packet path without I/O: an allreduce of `params` float32 from
// `workers` ranks fed through Engine::ingest, plain and with Adam applied at each chunk's completion.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/header.h"
#include "gradswitch/wire.h"
#include "switch/engine/engine.h"
#include "switch/engine/optimizer.h"

using namespace gradswitch;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Case {
  const char* name;
  OptimizerAlgo algo;
  float momentum;
  unsigned bytes_per_elem;
};

const Case kCases[] = {
    {"sgd", OptimizerAlgo::kSgd, 0.0f, 16},      {"sgd+momentum", OptimizerAlgo::kSgd, 0.9f, 24},
    {"adagrad", OptimizerAlgo::kAdagrad, 0, 24}, {"adam", OptimizerAlgo::kAdam, 0, 32},
    {"adamw", OptimizerAlgo::kAdamW, 0, 32},     {"smorms3", OptimizerAlgo::kSmorms3, 0, 40},
};

// Seconds per step (median-ish: the best of repeated timed batches, after a warm-up).
double time_step(const Case& c, size_t params, double seconds) {
  const uint32_t chunk = 360;  // elements per packet at --mtu 1500
  OptimizerSpec spec;
  spec.algo = c.algo;
  spec.params = params;
  spec.lr = 1e-3f;
  spec.momentum = c.momentum;
  spec.weight_decay = c.algo == OptimizerAlgo::kAdamW ? 0.01f : 0.0f;
  Optimizer opt(spec, chunk);
  // As in the engine, the gradient sum is overwritten with the new parameters (in place); the
  // buffer then holds parameters, which serve as the next step's gradient (values stay finite).
  std::vector<float> io(params);
  for (size_t i = 0; i < params; ++i) io[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 2001) - 1.0f;
  for (size_t i = 0; i < params; ++i) opt.params()[i] = 0.5f;
  auto one_step = [&] {
    for (size_t off = 0; off < params; off += chunk) {
      const size_t n = std::min<size_t>(chunk, params - off);
      opt.step(off, n, io.data() + off, 4, io.data() + off);
    }
  };
  one_step();
  double best = 1e30;
  auto t0 = Clock::now();
  do {
    auto t = Clock::now();
    one_step();
    best = std::min(best, since(t));
  } while (since(t0) < seconds);
  return best;
}

double copy_gbps(double seconds) {
  const size_t n = size_t{1} << 25;  // 2 x 128 MiB of floats
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  double best = 0;
  auto t0 = Clock::now();
  do {
    auto t = Clock::now();
    std::memcpy(b.data(), a.data(), n * 4);
    best = std::max(best, 2.0 * n * 4 / since(t) / 1e9);
  } while (since(t0) < seconds);
  return best;
}

__attribute__((noinline)) void scale_add(float* __restrict a, const float* __restrict b, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] * s + a[i];
}

double triad_gbps(double seconds) {
  const size_t n = size_t{1} << 25;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  double best = 0;
  auto t0 = Clock::now();
  do {
    auto t = Clock::now();
    scale_add(a.data(), b.data(), 0.5f, n);
    best = std::max(best, 3.0 * n * 4 / since(t) / 1e9);
  } while (since(t0) < seconds);
  return best + (a[7] == 12345.0f);  // keep the result alive
}

// Seconds per allreduce of `params` floats through the engine (best of repeated runs).
double engine_allreduce(size_t params, unsigned workers, bool adam, double seconds) {
  const uint32_t payload = GS_DEFAULT_PAYLOAD_BYTES, count = payload / 4;
  const uint16_t slots = 256;
  Engine engine(EngineConfig{1, 4});
  JobSpec spec;
  spec.name = "bench";
  spec.world = static_cast<uint16_t>(workers);
  spec.slots = slots;
  spec.payload_bytes = payload;
  spec.key = 42;
  spec.wire = GS_ELEM_FLOAT32;
  spec.endpoints.resize(workers);
  if (adam) {
    auto o = std::make_shared<OptimizerSpec>();
    o->algo = OptimizerAlgo::kAdam;
    o->params = params;
    o->lr = 1e-3f;
    spec.optimizer = o;
  }
  std::string err;
  const uint32_t id = engine.create_job(spec, &err);
  if (!id) {
    std::fprintf(stderr, "create_job: %s\n", err.c_str());
    std::exit(1);
  }
  // The workers' gradient tensors; packets are built in place like a worker's send buffers.
  std::vector<std::vector<float>> grads(workers, std::vector<float>(params));
  for (unsigned r = 0; r < workers; ++r)
    for (size_t i = 0; i < params; ++i) grads[r][i] = 1e-3f * static_cast<float>((i * 31 + r) % 977) - 0.4f;
  std::vector<uint8_t> pkt(GS_HEADER_BYTES + payload);
  gs_header h = HeaderBuilder(GS_MSG_DATA, id, 42).elems(GS_ELEM_FLOAT32, 0).exps(0, 0);
  std::vector<uint8_t> version(slots, 0);
  uint32_t seq = 0;
  std::vector<float> result(params);
  auto one = [&] {
    const size_t chunks = (params + count - 1) / count;
    for (size_t c = 0; c < chunks; ++c) {
      const uint16_t s = static_cast<uint16_t>(c % slots);
      const size_t off = c * count, n = std::min<size_t>(count, params - off);
      for (unsigned r = 0; r < workers; ++r) {
        h.rank = static_cast<uint16_t>(r), h.slot = s, h.seq = seq, h.offset = static_cast<uint32_t>(off);
        h.flags = version[s], h.count = static_cast<uint16_t>(n);
        gs_header_encode(&h, pkt.data());
        std::memcpy(pkt.data() + GS_HEADER_BYTES, grads[r].data() + off, n * 4);
        IngestResult res = engine.ingest(0, pkt.data(), GS_HEADER_BYTES + n * 4, 1, Endpoint{});
        if (res.kind == IngestResult::kDropped) {
          std::fprintf(stderr, "unexpected drop: %s\n", drop_reason_name(res.reason));
          std::exit(1);
        }
        if (res.kind == IngestResult::kSend)
          std::memcpy(result.data() + off, res.data + GS_HEADER_BYTES, n * 4);
      }
      version[s] ^= 1;
    }
    ++seq;
  };
  one();
  double best = 1e30;
  auto t0 = Clock::now();
  do {
    auto t = Clock::now();
    one();
    best = std::min(best, since(t));
  } while (since(t0) < seconds);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t params = 800000, large = size_t{1} << 25;
  unsigned workers = 2;
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--params")
      params = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--large")
      large = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (a == "--workers")
      workers = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--params N] [--large N] [--seconds S] [--workers W]\n", argv[0]);
      return 2;
    }
  }
  const double copy = copy_gbps(seconds), triad = triad_gbps(seconds);
  const double bw = std::max(copy, triad);
  std::printf("memory bandwidth, 1 core: copy %.2f GB/s, scale-add %.2f GB/s (reference: %.2f GB/s)\n", copy,
              triad, bw);
  std::printf("%-14s %6s %14s %12s %14s %12s %9s\n", "algorithm", "B/elem", "step@params ms", "GB/s",
              "step@large ms", "GB/s", "% of bw");
  for (const Case& c : kCases) {
    const double t_small = time_step(c, params, seconds);
    const double t_large = time_step(c, large, seconds);
    const double g_small = double(c.bytes_per_elem) * params / t_small / 1e9;
    const double g_large = double(c.bytes_per_elem) * large / t_large / 1e9;
    std::printf("%-14s %6u %14.3f %12.2f %14.2f %12.2f %8.0f%%\n", c.name, c.bytes_per_elem, t_small * 1e3,
                g_small, t_large * 1e3, g_large, 100.0 * g_large / bw);
  }
  std::printf("(params = %zu, large = %zu; chunks of 360 elements as at --mtu 1500)\n", params, large);
  const double plain = engine_allreduce(params, workers, false, seconds);
  const double with_adam = engine_allreduce(params, workers, true, seconds);
  std::printf(
      "engine allreduce of %zu float32 from %u workers (Engine::ingest, 1 thread): plain %.3f ms, "
      "with adam %.3f ms (+%.1f%%)\n",
      params, workers, plain * 1e3, with_adam * 1e3, 100.0 * (with_adam / plain - 1.0));
  return 0;
}
