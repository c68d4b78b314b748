// libFuzzer target over the worker's switch path (src/worker/switch): what a rank does with the
// datagrams that reach its socket, from the switch or from anyone who learned the job's id and key.
// The input is a first byte choosing the wire (float32, fixed32, int32, float16, bfloat16, mx8) and
// whether the job has bounded-time rounds (docs/protocol.md §3.1, whose RESULTs carry a PARTIAL
// trailer), then a sequence of datagrams (2-byte little-endian length, then the bytes) that rank 1
// of 3 receives in the middle of an allreduce, on a clock that advances with the input so that the
// loss timers fire. Checks: no crash, no sanitizer report, no error other than the worker's own (a
// clear message), and every packet the rank sends is a well-formed DATA of this job from this rank.
#include <cstdint>
#include <cstring>
#include <vector>

#include "datagram_input.h"
#include "gradswitch/wire.h"
#include "path_parts.h"
#include "worker/errors.h"
#include "worker/switch/switch_allreduce.h"

using namespace gradswitch;
using namespace gradswitch::worker;

namespace {

constexpr unsigned kWorld = 3, kRank = 1, kSlots = 4;
constexpr uint32_t kPayload = 64, kJob = 9, kKey = 0xABCD;
constexpr size_t kElements = 100;

class FuzzTransport : public Transport {
 public:
  FuzzTransport(const uint8_t* data, size_t size) : in_(data, size) {}
  uint16_t local_port() const override { return 5001; }
  void set_peer(uint32_t) override {}
  size_t send_batch(const OutPacket* pkts, size_t n) override {
    for (size_t i = 0; i < n; ++i) check_sent(pkts[i]);
    return n;
  }
  size_t recv_batch(InPacket*, size_t, int64_t) override { return 0; }  // the input goes through take()
  bool more_pending() const override { return false; }

  // Up to 3 datagrams of the input; how many.
  size_t next(std::vector<InPacket>* out) {
    out->resize(3);
    out->resize(in_.next(out->data(), out->size()));
    return out->size();
  }
  size_t position() const { return in_.position(); }

 private:
  static void check_sent(const OutPacket& p) {
    if (p.len < GS_HEADER_BYTES || p.len > GS_HEADER_BYTES + kPayload) __builtin_trap();
    gs_header h;
    gs_header_decode(p.data, &h);
    if (h.magic != GS_MAGIC || h.type != GS_MSG_DATA || h.job_id != kJob || h.key != kKey ||
        h.rank != kRank || h.slot >= kSlots)
      __builtin_trap();
    if (GS_HEADER_BYTES + gs_payload_bytes(h.elem_type, h.count) != p.len) __builtin_trap();
  }

  DatagramInput in_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const uint8_t kWires[] = {GS_ELEM_FLOAT32, GS_ELEM_FIXED32,  GS_ELEM_INT32,
                                   GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16, GS_ELEM_MX8};
  const uint8_t elem = kWires[data[0] % sizeof kWires];
  const bool deadline = data[0] & 0x80;
  FuzzTransport tx(data + 1, size - 1);
  Options opt;
  opt.rank = kRank;
  opt.world = kWorld;
  opt.job = "fuzz";
  opt.timeout_s = 3600;  // the input's clock ends long before: no progress timeout here
  opt.rto_initial_s = 0.0001;
  JoinInfo join;
  join.job_id = kJob;
  join.key = kKey;
  join.slots = kSlots;
  join.payload_bytes = kPayload - (deadline ? GS_PARTIAL_TRAILER_BYTES : 0);
  join.data_port = 7001;
  if (deadline) {
    opt.deadline_us = join.deadline_us = 1000;
    opt.quorum = join.quorum = 2;
  }
  PathParts parts(opt, join, &tx, "job 'fuzz' (rank 1 of 3)");
  SwitchAllreduce path(parts.ctx, nullptr);

  std::vector<float> tensor(kElements);
  for (size_t i = 0; i < kElements; ++i) tensor[i] = static_cast<float>(i % 13) - 6.0f;
  std::vector<int8_t> exps;
  AllreduceOp op;
  op.base = reinterpret_cast<uint8_t*>(tensor.data());
  op.ch = make_chunking(kElements, elem, join.payload_bytes,
                        elem == GS_ELEM_INT32 ? DType::kInt32 : DType::kFloat32);
  if (elem == GS_ELEM_FIXED32) {
    block_exponents(op.ch, tensor.data(), &exps);
    op.exps = &exps;
  }
  op.seq = 0;
  std::vector<AllreduceOp*> finished;
  std::vector<InPacket> in;
  try {
    path.admit(&op);
    // 10 µs of the clock per input byte: a few hundred bytes pass the first resend timers.
    while (tx.next(&in) > 0) {
      const int64_t now = static_cast<int64_t>(tx.position()) * 10'000;
      if (std::exception_ptr lost = path.take(in.data(), in.size(), now, &finished))
        std::rethrow_exception(lost);
      path.service(now, false, nullptr, true, &finished);
    }
  } catch (const Error&) {
    // A clear error (an ABORT, the ranks' calls differing in size or type) is the right answer to
    // packets that contradict this rank's allreduce.
  }
  return 0;
}
