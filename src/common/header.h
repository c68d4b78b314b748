// Building a gs_header (include/gradswitch/wire.h) field group by field group, so that the fields
// every message carries (magic, version, type, job_id, key) are set in one place:
//   HeaderBuilder(GS_MSG_DATA, job_id, key).rank(r).slot(s).flags(v).elems(GS_ELEM_FLOAT32, n)
//       .round(seq, offset).encode(buf);
// What is not set stays "nothing": rank 0, slot 0, no flags, count 0, next_exp GS_EXP_NONE,
// scale_exp 0, window 0.
#pragma once

#include <cstdint>

#include "gradswitch/wire.h"

namespace gradswitch {

class HeaderBuilder {
 public:
  HeaderBuilder(uint8_t type, uint32_t job_id, uint32_t key) {
    h_.magic = GS_MAGIC;
    h_.version = GS_VERSION;
    h_.type = type;
    h_.job_id = job_id;
    h_.key = key;
    h_.next_exp = GS_EXP_NONE;
  }
  HeaderBuilder& rank(uint16_t r) { return h_.rank = r, *this; }
  HeaderBuilder& slot(uint16_t s) { return h_.slot = s, *this; }
  HeaderBuilder& flags(uint8_t f) { return h_.flags = f, *this; }
  HeaderBuilder& elems(uint8_t elem_type, uint16_t count) {
    h_.elem_type = elem_type;
    h_.count = count;
    return *this;
  }
  HeaderBuilder& round(uint32_t seq, uint32_t offset) {
    h_.seq = seq;
    h_.offset = offset;
    return *this;
  }
  HeaderBuilder& exps(int8_t next_exp, int8_t scale_exp) {
    h_.next_exp = next_exp;
    h_.scale_exp = scale_exp;
    return *this;
  }
  HeaderBuilder& window(uint16_t rounds) { return h_.window = rounds, *this; }
  const gs_header& get() const { return h_; }
  operator gs_header() const { return h_; }  // NOLINT: a builder converts to what it builds
  void encode(void* buf) const { gs_header_encode(&h_, buf); }

 private:
  gs_header h_{};
};

}  // namespace gradswitch
