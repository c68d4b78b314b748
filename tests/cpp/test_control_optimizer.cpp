// Control-plane parsing for optimizer jobs (docs/protocol.md §1.3): JOIN's optimizer keys,
// PARAMS / SETLR / STATE_SET arguments, floats, and the checkpoint header.
#include <cmath>
#include <cstring>
#include <string>

#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/control/parse.h"

using namespace gradswitch;
using namespace gradswitch::control;

static const std::string kBase = "JOIN job=j world=2 rank=0 wire=float32 token=t port=4000";

static std::optional<JoinRequest> join(const std::string& extra, Error* err) {
  auto r = parse_request(kBase + " " + extra, err);
  if (!r) return std::nullopt;
  return parse_join(*r, err);
}

static bool join_fails(const std::string& extra, const std::string& mention) {
  Error err;
  auto j = join(extra, &err);
  bool ok = !j && std::string(err.code) == kErrBadRequest && err.message.find(mention) != std::string::npos;
  if (!ok) std::fprintf(stderr, "  '%s' -> %s %s\n", extra.c_str(), err.code, err.message.c_str());
  return ok;
}

TEST(join_without_optimizer_has_none) {
  Error err;
  auto j = join("", &err);
  CHECK(j.has_value());
  CHECK(!j->optimizer.has_value());
}

TEST(join_adam_all_keys) {
  Error err;
  auto j = join(
      "optimizer=adam params=800000 lr=0.001 beta1=0.8 beta2=0.99 eps=1e-6 weight_decay=0.5 eps_mode=torch "
      "average=0",
      &err);
  CHECK(j.has_value());
  CHECK(j->optimizer.has_value());
  const OptimizerSpec& o = *j->optimizer;
  CHECK(o.algo == OptimizerAlgo::kAdam);
  CHECK_EQ(o.params, uint64_t{800000});
  CHECK(o.lr == 0.001f && o.beta1 == 0.8f && o.beta2 == 0.99f && o.eps == 1e-6f && o.weight_decay == 0.5f);
  CHECK(o.eps_placement == EpsPlacement::kOutsideSqrt);
  CHECK(!o.average);
}

TEST(join_defaults) {
  Error err;
  auto j = join("optimizer=sgd params=10 lr=0.5", &err);
  CHECK(j.has_value());
  const OptimizerSpec& o = *j->optimizer;
  OptimizerSpec d;
  CHECK(o.algo == OptimizerAlgo::kSgd && o.lr == 0.5f);
  CHECK(o.momentum == d.momentum && o.dampening == d.dampening && o.nesterov == d.nesterov);
  CHECK(o.eps == d.eps && o.beta1 == d.beta1 && o.beta2 == d.beta2 && o.average == d.average);
  CHECK(o.eps_placement == EpsPlacement::kInsideSqrt);
  auto s = join("optimizer=sgd params=10 lr=0.1 momentum=0.9 nesterov=1", &err);
  CHECK(s.has_value() && s->optimizer->nesterov && s->optimizer->momentum == 0.9f);
  auto a = join("optimizer=adagrad params=10 lr=0.1 lr_decay=0.01 initial_accumulator=0.1 eps=1e-10", &err);
  CHECK(a.has_value() && a->optimizer->algo == OptimizerAlgo::kAdagrad && a->optimizer->lr_decay == 0.01f &&
        a->optimizer->initial_accumulator == 0.1f && a->optimizer->eps == 1e-10f);
  auto w = join("optimizer=adamw params=10 lr=0.1 weight_decay=0.01", &err);
  CHECK(w.has_value() && w->optimizer->algo == OptimizerAlgo::kAdamW);
  auto m = join("optimizer=smorms3 params=4294967295 lr=0.001 eps=1e-16", &err);
  CHECK(m.has_value() && m->optimizer->params == 0xFFFFFFFFull);
}

TEST(join_optimizer_invalid) {
  CHECK(join_fails("optimizer=rmsprop params=10 lr=1", "unknown"));
  CHECK(join_fails("optimizer=adam lr=1", "params="));
  CHECK(join_fails("optimizer=adam params=0 lr=1", "params="));
  CHECK(join_fails("optimizer=adam params=4294967296 lr=1", "params="));
  CHECK(join_fails("optimizer=adam params=10", "lr="));
  CHECK(join_fails("lr=0.1", "needs optimizer="));
  CHECK(join_fails("params=10", "needs optimizer="));
  CHECK(join_fails("optimizer=adam params=10 lr=-1", "lr="));
  CHECK(join_fails("optimizer=adam params=10 lr=nan", "lr="));
  CHECK(join_fails("optimizer=adam params=10 lr=inf", "lr="));
  CHECK(join_fails("optimizer=adam params=10 lr=1e39", "lr="));
  CHECK(join_fails("optimizer=adam params=10 lr=0x1p3", "lr="));
  CHECK(join_fails("optimizer=adam params=10 lr=1 beta1=1", "beta1="));
  CHECK(join_fails("optimizer=adam params=10 lr=1 beta2=-0.1", "beta2="));
  CHECK(join_fails("optimizer=adam params=10 lr=1 momentum=0.9", "does not apply"));
  CHECK(join_fails("optimizer=sgd params=10 lr=1 beta1=0.9", "does not apply"));
  CHECK(join_fails("optimizer=sgd params=10 lr=1 eps=1", "does not apply"));
  CHECK(join_fails("optimizer=smorms3 params=10 lr=1 eps_mode=torch", "does not apply"));
  CHECK(join_fails("optimizer=adam params=10 lr=1 eps_mode=numpy", "eps_mode"));
  CHECK(join_fails("optimizer=adam params=10 lr=1 average=yes", "average"));
  CHECK(join_fails("optimizer=sgd params=10 lr=1 nesterov=1", "nesterov"));
  CHECK(join_fails("optimizer=sgd params=10 lr=1 momentum=0.9 dampening=0.1 nesterov=1", "nesterov"));
  CHECK(join_fails("optimizer=smorms3 params=10 lr=1 eps=0", "eps > 0"));
  CHECK(join_fails("optimizer=adam params=10 lr=1 weight_decay=-1", "weight_decay"));
  CHECK(join_fails("optimizer=adam params=10 lr=1 colour=red", "unknown key"));
  Error err;
  auto r = parse_request(
      "JOIN job=j world=2 rank=0 wire=float16 token=t port=4000 optimizer=sgd params=1 lr=1", &err);
  CHECK(r.has_value());
  CHECK(!parse_join(*r, &err));
  CHECK(err.message.find("wire=float32") != std::string::npos);
}

TEST(floats_parse_and_round_trip) {
  CHECK(parse_float("0.001") == 0.001f);
  CHECK(parse_float("1e-3") == 0.001f);
  CHECK(parse_float("1E-3") == 0.001f);
  CHECK(parse_float("-2.5") == -2.5f);
  CHECK(parse_float(".5") == 0.5f);
  CHECK(parse_float("5.") == 5.0f);
  CHECK(parse_float("0") == 0.0f);
  CHECK(!parse_float("1e-50").has_value());  // out of float32 range (below the smallest subnormal)
  for (const char* bad :
       {"", "-", ".", "e5", "1e", "1e+", "+1", "0x10", "inf", "nan", "1.0f", "1,5", "3e39", " 1"})
    CHECK(!parse_float(bad).has_value());
  for (float v : {0.001f, 1e-8f, 0.9f, 0.999f, 3.14159274f, 1e-45f, 3.4028235e38f, 0.1f}) {
    auto back = parse_float(format_float(v));
    CHECK(back.has_value() && std::memcmp(&*back, &v, 4) == 0);
  }
}

TEST(same_optimizer_compares_every_field) {
  Error err;
  auto a = join("optimizer=adam params=10 lr=0.001", &err)->optimizer;
  auto b = join("optimizer=adam params=10 lr=1e-3 beta1=0.9", &err)->optimizer;  // same values, other text
  CHECK(same_optimizer(*a, *b));
  for (const char* other :
       {"optimizer=adam params=11 lr=0.001", "optimizer=adam params=10 lr=0.002",
        "optimizer=adamw params=10 lr=0.001", "optimizer=adam params=10 lr=0.001 eps_mode=torch",
        "optimizer=adam params=10 lr=0.001 average=0", "optimizer=adam params=10 lr=0.001 beta2=0.99",
        "optimizer=adam params=10 lr=0.001 eps=1e-7", "optimizer=adam params=10 lr=0.001 weight_decay=1"}) {
    auto c = join(other, &err)->optimizer;
    CHECK(!same_optimizer(*a, *c));
  }
  // describe_optimizer's text parses back to the same spec.
  for (const char* text :
       {"optimizer=sgd params=7 lr=0.1 momentum=0.9 dampening=0.1",
        "optimizer=adagrad params=7 lr=0.1 lr_decay=0.5 initial_accumulator=0.25 eps_mode=torch",
        "optimizer=adam params=7 lr=0.003 beta1=0.5 eps=1e-7 weight_decay=0.1 average=0",
        "optimizer=smorms3 params=7 lr=0.003 eps=1e-16"}) {
    auto s = join(text, &err)->optimizer;
    auto again = join(describe_optimizer(*s).substr(0), &err);
    CHECK(again.has_value() && same_optimizer(*s, *again->optimizer));
  }
}

TEST(verbs_with_underscore_and_binary_lengths) {
  Error err;
  auto r = parse_request("STATE_GET", &err);
  CHECK(r.has_value() && r->verb == "STATE_GET");
  CHECK(parse_no_args(*r, &err));
  CHECK(!parse_request("_STATE", &err).has_value());
  CHECK(!parse_request("STATE-GET", &err).has_value());

  auto p = parse_request("PARAMS offset=360 count=1000", &err);
  CHECK(p.has_value());
  CHECK(binary_length(*p) == uint64_t{4000});
  auto pp = parse_params(*p, &err);
  CHECK(pp.has_value() && pp->offset == 360 && pp->count == 1000);
  CHECK(binary_length(*parse_request("PARAMS offset=0", &err)) == std::nullopt);
  CHECK(binary_length(*parse_request("PARAMS count=x", &err)) == std::nullopt);
  CHECK(binary_length(*parse_request("PARAMS count=4294967296", &err)) == std::nullopt);
  CHECK(binary_length(*parse_request("PARAMS count=4294967295", &err)) == uint64_t{4294967295ull * 4});
  // Length known, other arguments wrong: still framed (the payload is discarded, then ERR).
  auto bad = parse_request("PARAMS count=2 offset=-1", &err);
  CHECK(binary_length(*bad) == uint64_t{8});
  CHECK(!parse_params(*bad, &err).has_value());
  CHECK(binary_length(*parse_request("PARAMS count=2 extra=1", &err)) == uint64_t{8});
  CHECK(!parse_params(*parse_request("PARAMS count=2 offset=0 extra=1", &err), &err).has_value());

  auto s = parse_request("STATE_SET bytes=1234", &err);
  CHECK(binary_length(*s) == uint64_t{1234});
  CHECK(parse_state_set(*s, &err) == uint64_t{1234});
  CHECK(binary_length(*parse_request("STATE_SET", &err)) == std::nullopt);
  CHECK(binary_length(*parse_request("STATE_SET bytes=1099511627777", &err)) == std::nullopt);
  CHECK(binary_length(*parse_request("PING count=3", &err)) == std::nullopt);

  CHECK(parse_setlr(*parse_request("SETLR lr=0.01", &err), &err) == 0.01f);
  CHECK(!parse_setlr(*parse_request("SETLR lr=-0.01", &err), &err).has_value());
  CHECK(!parse_setlr(*parse_request("SETLR lr=nan", &err), &err).has_value());
  CHECK(!parse_setlr(*parse_request("SETLR", &err), &err).has_value());
  CHECK(!parse_setlr(*parse_request("SETLR lr=1 x=2", &err), &err).has_value());
}

TEST(state_header_round_trip_and_mismatch) {
  OptimizerSpec spec;
  spec.algo = OptimizerAlgo::kAdam;
  spec.params = 1000;
  StateHeader h = state_header_for(spec, 360, 0.25f);
  CHECK_EQ(int(h.arrays), 3);
  CHECK_EQ(h.chunks, 3u);
  CHECK_EQ(state_blob_bytes(h), uint64_t{32 + 3 * 4000 + 3 * 4});
  uint8_t buf[kStateHeaderBytes];
  encode_state_header(h, buf);
  CHECK(std::memcmp(buf, "GSOPTST1", 8) == 0);
  CHECK(buf[8] == 2 && buf[9] == 3 && buf[10] == 0 && buf[11] == 0);
  CHECK(buf[12] == 0x68 && buf[13] == 0x01);                  // 360 little-endian
  CHECK(buf[16] == 0xe8 && buf[17] == 0x03 && buf[18] == 0);  // 1000
  CHECK(buf[24] == 3);
  CHECK(buf[28] == 0 && buf[29] == 0 && buf[30] == 0x80 && buf[31] == 0x3e);  // 0.25f = 0x3e800000
  Error err;
  auto d = decode_state_header(buf, h, &err);
  CHECK(d.has_value() && d->lr == 0.25f && d->params == 1000);
  StateHeader other = h;
  other.lr = 1.0f;  // lr may differ: the checkpoint's is restored
  CHECK(decode_state_header(buf, other, &err).has_value());
  other = state_header_for(spec, 300, 0.25f);
  CHECK(!decode_state_header(buf, other, &err).has_value());
  CHECK(std::string(err.code) == kErrConflict && err.message.find("--mtu") != std::string::npos);
  spec.algo = OptimizerAlgo::kSmorms3;
  CHECK(!decode_state_header(buf, state_header_for(spec, 360, 0.25f), &err).has_value());
  CHECK(err.message.find("adam") != std::string::npos);
  uint8_t bad[kStateHeaderBytes];
  std::memcpy(bad, buf, sizeof bad);
  bad[0] = 'X';
  CHECK(!decode_state_header(bad, h, &err).has_value());
  std::memcpy(bad, buf, sizeof bad);
  float nan = NAN;
  std::memcpy(bad + 28, &nan, 4);
  CHECK(!decode_state_header(bad, h, &err).has_value());
}

TEST(framer_take_raw_bytes) {
  LineFramer f;
  std::string line;
  const char in[] = "PARAMS offset=0 count=2\nABCDEFGHPING\n";
  f.append(in, sizeof in - 1);
  CHECK(f.next(&line) == LineFramer::Next::kLine);
  CHECK(line == "PARAMS offset=0 count=2");
  char raw[8];
  CHECK_EQ(f.take(raw, 5), size_t{5});
  CHECK_EQ(f.take(raw + 5, 3), size_t{3});
  CHECK(std::memcmp(raw, "ABCDEFGH", 8) == 0);
  CHECK(f.next(&line) == LineFramer::Next::kLine);
  CHECK(line == "PING");
  CHECK_EQ(f.take(nullptr, 10), size_t{0});
  f.append("xyz", 3);
  CHECK_EQ(f.take(nullptr, 10), size_t{3});
  CHECK_EQ(f.buffered(), size_t{0});
}

GS_TEST_MAIN()
