// Engine alone: how fast the switch sums, per core, for each wire type, next to this machine's
// memory bandwidth measured the same way (bytes read per second by one core).
//
//   build/bench/engine_bench [--workers 4] [--seconds 1] [--simd scalar|avx2|avx512] [--cpu-time]
//
// "ingest" feeds complete DATA packets of `workers` ranks through Engine::ingest (validation,
// slot logic, summation, result header, narrowing of 16-bit sums): the switch's whole per-packet
// work without I/O. Throughput counts payload bytes received per second.
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/header.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "switch/engine/engine.h"

using namespace gradswitch;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --cpu-time: ingest rates per second of this thread's CPU time, so that on a shared machine the
// time the thread spent preempted does not count (caches disturbed by others still do).
bool g_cpu_time = false;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// One core's read bandwidth: sum a buffer far larger than the caches (what the switch must do
// with every received byte, at best).
double memory_read_gbps(double seconds) {
  const size_t n = size_t{1} << 26;  // 256 MiB of floats
  std::vector<float> a(n, 1.0f);
  const Kernels& k = kernels();
  std::vector<float> acc(4096, 0.0f);
  size_t bytes = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    for (size_t i = 0; i < n; i += 4096) k.add_f32(acc.data(), a.data() + i, 4096);
    bytes += n * 4;
  }
  return bytes / seconds_since(t0) / 1e9;
}

double memcpy_gbps(double seconds) {
  const size_t n = size_t{1} << 27;  // 128 MiB
  std::vector<char> a(n, 1), b(n, 2);
  size_t bytes = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    std::memcpy(b.data(), a.data(), n);
    bytes += n;
  }
  return bytes / seconds_since(t0) / 1e9;
}

struct Result {
  double gbps, mpps;
};

Result ingest(uint8_t elem_type, unsigned workers, double seconds, size_t ring) {
  const uint32_t payload = GS_DEFAULT_PAYLOAD_BYTES;
  const uint16_t slots = 256;
  Engine engine(EngineConfig{1, 4});
  JobSpec spec;
  spec.name = "bench";
  spec.world = workers;
  spec.slots = slots;
  spec.payload_bytes = payload;
  spec.key = 42;
  spec.wire =
      elem_type == GS_ELEM_INT32 ? static_cast<uint8_t>(GS_ELEM_FLOAT32) : elem_type;  // int32: any wire
  spec.endpoints.resize(workers);
  std::string err;
  const uint32_t id = engine.create_job(spec, &err);
  const auto count = static_cast<uint16_t>(gs_max_count(elem_type, payload));
  const size_t len = GS_HEADER_BYTES + gs_payload_bytes(elem_type, count);  // mx8: 1419 of the 1440
  // Received packets live in receive buffers: a small ring stays in cache (as right after the
  // kernel's copy into recvmmsg's buffers), a large one makes every packet come from DRAM.
  std::vector<std::vector<uint8_t>> pkts(ring * workers, std::vector<uint8_t>(GS_HEADER_BYTES + payload));
  for (size_t i = 0; i < pkts.size(); ++i)
    for (size_t b = GS_HEADER_BYTES; b < pkts[i].size(); b += 2)
      pkts[i][b] = uint8_t(i + b), pkts[i][b + 1] = 0x3c;
  if (elem_type == GS_ELEM_MX8) {  // the byte pattern above would hold subnormal scales: real blocks
    std::vector<float> values(count);
    for (size_t i = 0; i < pkts.size(); ++i) {
      for (size_t k = 0; k < values.size(); ++k) values[k] = std::ldexp(float((i + 7 * k) % 61) - 30, -12);
      kernels().f32_to_mx8(pkts[i].data() + GS_HEADER_BYTES, values.data(), count);
    }
  }
  gs_header h = HeaderBuilder(GS_MSG_DATA, id, 42).elems(elem_type, count).exps(0, 0);
  uint64_t packets = 0;
  uint32_t seq = 0;
  size_t next = 0;
  auto t0 = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  while (seconds_since(t0) < seconds) {
    for (int rep = 0; rep < 64; ++rep, ++seq) {
      // One round of every slot: chunk c in slot c % slots, version flips per round.
      for (uint16_t s = 0; s < slots; ++s) {
        for (unsigned r = 0; r < workers; ++r) {
          std::vector<uint8_t>& p = pkts[next];
          next = next + 1 == pkts.size() ? 0 : next + 1;
          h.rank = r, h.slot = s, h.seq = seq, h.offset = s * count, h.flags = seq & 1;
          gs_header_encode(&h, p.data());
          IngestResult res = engine.ingest(0, p.data(), len, 1, Endpoint{});
          if (res.kind == IngestResult::kDropped) {
            std::fprintf(stderr, "unexpected drop: %s\n", drop_reason_name(res.reason));
            std::exit(1);
          }
        }
      }
      packets += size_t{slots} * workers;
    }
  }
  const double t = g_cpu_time ? thread_cpu_seconds() - cpu0 : seconds_since(t0);
  return {packets * double(len - GS_HEADER_BYTES) / t / 1e9, packets / t / 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  unsigned workers = 4;
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--workers" && i + 1 < argc)
      workers = std::atoi(argv[++i]);
    else if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (a == "--simd" && i + 1 < argc)
      setenv("GRADSWITCH_SIMD", argv[++i], 1);
    else if (a == "--cpu-time")
      g_cpu_time = true;
    else {
      std::printf("usage: %s [--workers N (4)] [--seconds S (1)] [--simd scalar|avx2|avx512] [--cpu-time]\n",
                  argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::printf("kernels: %s, workers: %u, payload %u B\n", kernels().name, workers, GS_DEFAULT_PAYLOAD_BYTES);
  const double read_bw = memory_read_gbps(seconds);
  std::printf("%-28s %8.2f GB/s\n", "memory read (1 core)", read_bw);
  std::printf("%-28s %8.2f GB/s\n", "memcpy (1 core)", memcpy_gbps(seconds));
  for (uint8_t t : {GS_ELEM_FLOAT32, GS_ELEM_INT32, GS_ELEM_FIXED32, GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16,
                    GS_ELEM_FLOAT64, GS_ELEM_MX8}) {
    for (size_t ring : {size_t{64}, size_t{1} << 15}) {
      Result r = ingest(t, workers, seconds, ring);
      std::printf("ingest %-9s %-11s %8.2f GB/s  %6.2f Mpps  %5.0f%% of memory read\n", gs_elem_name(t),
                  ring == 64 ? "(hot)" : "(cold)", r.gbps, r.mpps, 100 * r.gbps / read_bw);
    }
  }
  return 0;
}
