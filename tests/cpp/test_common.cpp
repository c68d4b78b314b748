// The small helpers every part shares (src/common): serial-number order, the loss injector, the
// header builder, and SHA-256 / HMAC-SHA-256 (checked against FIPS 180-4 and RFC 4231 vectors).
#include <cstdint>
#include <vector>

#include "common/counter.h"
#include "common/header.h"
#include "common/rng.h"
#include "common/seq.h"
#include "common/sha256.h"
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
  CHECK(h.offset == 0 && h.next_exp == GS_EXP_NONE && h.scale_exp == 0 && h.window == 0);
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

TEST(sha256_matches_fips_180_vectors) {
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;  // fed in pieces that straddle block boundaries
  const std::string piece(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(piece);
  CHECK(to_hex(million.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(hmac_sha256_matches_rfc_4231_vectors) {
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(constant_time_equal("abc", "abc") && !constant_time_equal("abc", "abd") &&
        !constant_time_equal("ab", "abc"));
}

GS_TEST_MAIN()
