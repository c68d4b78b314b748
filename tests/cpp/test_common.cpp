// The small helpers every part shares (src/common): serial-number order, the loss injector and
// the header builder.
#include <cstdint>
#include <vector>

#include "common/counter.h"
#include "common/header.h"
#include "common/rng.h"
#include "common/seq.h"
#include "gradswitch/wire.h"
#include "harness.h"

using namespace gradswitch;

TEST(serial_order_wraps_at_2_pow_32) {
  CHECK(seq_after(1, 0) && !seq_after(0, 1) && !seq_after(5, 5));
  CHECK(seq_after(0, 0xFFFFFFFFu) && !seq_after(0xFFFFFFFFu, 0));
  CHECK(seq_at_or_after(5, 5) && seq_at_or_after(3, 0xFFFFFFF0u) && !seq_at_or_after(0xFFFFFFF0u, 3));
  CHECK(round_is_newer(0, 0, 0xFFFFFFFFu, 720));  // a later allreduce, whatever the offset
  CHECK(round_is_newer(7, 720, 7, 360) && !round_is_newer(7, 360, 7, 720) && !round_is_newer(7, 360, 7, 360));
}

TEST(loss_injector_drops_the_asked_fraction_reproducibly) {
  LossInjector none, all(1.0, 1, 0), tenth(0.1, 42, 3), again(0.1, 42, 3), other(0.1, 42, 4);
  CHECK(!none.active() && all.active());
  int dropped = 0, same = 0, differs = 0;
  for (int i = 0; i < 100000; ++i) {
    CHECK(!none.drop() && all.drop());
    const bool d = tenth.drop();
    dropped += d;
    same += d == again.drop();
    differs += d != other.drop();
  }
  CHECK(dropped > 9000 && dropped < 11000);  // 10% +- 10 standard deviations
  CHECK_EQ(same, 100000);                    // a seed and stream give the same drops
  CHECK(differs > 1000);                     // another stream does not drop in lockstep
}

TEST(header_builder_sets_the_common_fields_and_nothing_else) {
  uint8_t buf[GS_HEADER_BYTES];
  HeaderBuilder(GS_MSG_DATA, 0x01020304, 0xA5A5A5A5).encode(buf);
  gs_header h;
  gs_header_decode(buf, &h);
  CHECK(h.magic == GS_MAGIC && h.version == GS_VERSION && h.type == GS_MSG_DATA);
  CHECK(h.job_id == 0x01020304 && h.key == 0xA5A5A5A5);
  CHECK(h.rank == 0 && h.slot == 0 && h.flags == 0 && h.elem_type == 0 && h.count == 0 && h.seq == 0);
  CHECK(h.offset == 0 && h.next_exp == GS_EXP_NONE && h.scale_exp == 0 && h.completer == 0);
  const gs_header b = HeaderBuilder(GS_MSG_RESULT, 1, 2)
                          .rank(GS_RANK_ALL)
                          .slot(9)
                          .flags(GS_FLAG_VERSION)
                          .elems(GS_ELEM_FIXED32, 360)
                          .round(7, 720)
                          .exps(3, 26);
  CHECK(b.rank == GS_RANK_ALL && b.slot == 9 && b.flags == GS_FLAG_VERSION && b.elem_type == GS_ELEM_FIXED32);
  CHECK(b.count == 360 && b.seq == 7 && b.offset == 720 && b.next_exp == 3 && b.scale_exp == 26);
}

TEST(single_writer_counter_adds) {
  std::atomic<uint64_t> c{5};
  counter_add(c);
  counter_add(c, 10);
  CHECK_EQ(c.load(), uint64_t{16});
}

GS_TEST_MAIN()
