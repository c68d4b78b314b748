// libFuzzer target over the ring's receive path (src/worker/ring): what a rank does with the
// datagrams its neighbours (or anyone who learned the job's id and key) send it. The input is a
// first byte choosing the wire (float32, fixed32, int32, float16, bfloat16), then a sequence of
// datagrams (2-byte little-endian length, then the bytes) that rank 1 of 3 receives in the middle
// of an allreduce. The job id and key are fixed (seeds_ring.py writes valid partials and results
// for them) so the fuzzer reaches every state of a round. Checks: no crash, no sanitizer report,
// no error other than the worker's own (a clear message), and every packet the rank sends is a
// well-formed ring packet of this job, addressed to a neighbour, within the payload size.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "datagram_input.h"
#include "gradswitch/wire.h"
#include "path_parts.h"
#include "worker/errors.h"
#include "worker/ring/ring_allreduce.h"

using namespace gradswitch;
using namespace gradswitch::worker;

namespace {

constexpr uint16_t kBasePort = 5000;
constexpr unsigned kWorld = 3, kRank = 1, kSlots = 4;
constexpr uint32_t kPayload = 64, kJob = 9, kKey = 0xABCD;
constexpr size_t kElements = 100;  // 7 chunks of 16 (4-byte wires) or 4 of 32 (16-bit wires)

// Hands the fuzz input to the ring a few datagrams per call, and checks what it sends.
class FuzzTransport : public Transport {
 public:
  FuzzTransport(const uint8_t* data, size_t size) : in_(data, size) {}
  uint16_t local_port() const override { return kBasePort + kRank; }
  void set_peer(uint32_t) override {}
  size_t send_batch(const OutPacket* pkts, size_t n) override {
    for (size_t i = 0; i < n; ++i) check_sent(pkts[i]);
    return n;
  }
  size_t recv_batch(InPacket* pkts, size_t max, int64_t) override {
    return in_.next(pkts, std::min<size_t>(max, 3));
  }
  bool more_pending() const override { return !in_.exhausted(); }
  bool exhausted() const { return in_.exhausted(); }

 private:
  static void check_sent(const OutPacket& p) {
    if (p.len < GS_HEADER_BYTES || p.len > GS_HEADER_BYTES + kPayload) __builtin_trap();
    if (p.dst_port != kBasePort + (kRank + 1) % kWorld &&
        p.dst_port != kBasePort + (kRank + kWorld - 1) % kWorld)
      __builtin_trap();
    gs_header h;
    gs_header_decode(p.data, &h);
    if (h.magic != GS_MAGIC || h.job_id != kJob || h.key != kKey || h.rank != kRank || h.slot >= kSlots)
      __builtin_trap();
    if (h.type != GS_MSG_RING_PARTIAL && h.type != GS_MSG_RING_RESULT && h.type != GS_MSG_RING_DONE)
      __builtin_trap();
    const size_t bytes = gs_payload_bytes(h.elem_type, h.count);
    if (h.type != GS_MSG_RING_DONE && (gs_elem_size(h.elem_type) == 0 || GS_HEADER_BYTES + bytes != p.len))
      __builtin_trap();
  }

  DatagramInput in_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const uint8_t kWires[] = {GS_ELEM_FLOAT32, GS_ELEM_FIXED32, GS_ELEM_INT32, GS_ELEM_FLOAT16,
                                   GS_ELEM_BFLOAT16};
  const uint8_t elem = kWires[data[0] % sizeof kWires];
  FuzzTransport tx(data + 1, size - 1);
  Options opt;
  opt.rank = kRank;
  opt.world = kWorld;
  opt.job = "fuzz";
  opt.timeout_s = 3600;  // the input ends long before: no timer may fire an error here
  PathParts parts(opt, {}, &tx, "job 'fuzz' (rank 1 of 3)");
  RingAllreduce ring(parts.ctx, loopback_ring(kWorld, kBasePort, kJob, kKey, kSlots, kPayload));

  std::vector<float> tensor(kElements);
  for (size_t i = 0; i < kElements; ++i) tensor[i] = static_cast<float>(i % 13) - 6.0f;
  std::vector<int8_t> exps;
  AllreduceOp op;
  op.base = reinterpret_cast<uint8_t*>(tensor.data());
  op.ch = make_chunking(kElements, elem, kPayload, elem == GS_ELEM_INT32 ? DType::kInt32 : DType::kFloat32);
  if (elem == GS_ELEM_FIXED32) {
    block_exponents(op.ch, tensor.data(), &exps);
    op.exps = &exps;
  }
  op.seq = 0;
  std::vector<AllreduceOp*> finished;
  try {
    ring.admit(&op);
    // Each step takes up to 3 datagrams; the bound only guards against a step that takes none.
    for (size_t steps = 0; !tx.exhausted() && steps < size; ++steps) ring.step(&finished);
  } catch (const Error&) {
    // A clear error (e.g. "the ranks' allreduce calls differ in size or type") is the right answer
    // to packets that contradict this rank's allreduce.
  }
  return 0;
}
