// Control-plane parsing and framing (src/switch/control/parse.h).
#include <string>

#include "gradswitch/wire.h"
#include "harness.h"
#include "switch/control/parse.h"

using namespace gradswitch::control;

static std::optional<Request> req(const std::string& line, Error* err) {
  return parse_request(line, err);
}

TEST(framer_splits_lines_and_strips_cr) {
  LineFramer f;
  std::string line;
  f.append("PING\r\nJO", 8);
  CHECK(f.next(&line) == LineFramer::Next::kLine);
  CHECK(line == "PING");
  CHECK(f.next(&line) == LineFramer::Next::kNone);
  f.append("IN\n\n", 4);
  CHECK(f.next(&line) == LineFramer::Next::kLine);
  CHECK(line == "JOIN");
  CHECK(f.next(&line) == LineFramer::Next::kLine);
  CHECK(line.empty());
  CHECK(f.next(&line) == LineFramer::Next::kNone);
  CHECK_EQ(f.buffered(), size_t{0});
}

TEST(framer_limit_is_4096_with_terminator) {
  LineFramer ok;
  std::string max(4095, 'x');
  max += '\n';
  ok.append(max.data(), max.size());
  std::string line;
  CHECK(ok.next(&line) == LineFramer::Next::kLine);
  CHECK_EQ(line.size(), size_t{4095});

  LineFramer over;
  std::string big(4096, 'x');
  big += '\n';
  over.append(big.data(), big.size());
  CHECK(over.next(&line) == LineFramer::Next::kTooLong);

  LineFramer unterminated;  // detected before the newline ever arrives
  std::string part(4096, 'y');
  unterminated.append(part.data(), 4095);
  CHECK(unterminated.next(&line) == LineFramer::Next::kNone);
  unterminated.append(part.data(), 1);
  CHECK(unterminated.next(&line) == LineFramer::Next::kTooLong);
}

TEST(request_tokens) {
  Error err;
  auto r = req("STATUS   job_id=7  slot=3 version=1", &err);
  CHECK(r.has_value());
  CHECK(r->verb == "STATUS");
  CHECK_EQ(r->args.size(), size_t{3});
  CHECK(r->find("slot") && *r->find("slot") == "3");
  CHECK(!r->find("nope"));
  CHECK(req("PING", &err).has_value());
}

TEST(request_rejects_malformed) {
  for (const char* bad : {"", "   ", "ping", "PING x", "PING =1", "PING Key=1", "PING k=", "PING k=1 k=2",
                          "PING\tk=1", "P1NG", "PING k=\x01", "PING k=\xff"}) {
    Error err;
    CHECK(!req(bad, &err).has_value());
    CHECK(std::string(err.code) == kErrBadRequest);
    CHECK(!err.message.empty());
  }
}

TEST(join_valid) {
  Error err;
  auto r = req("JOIN job=train-1 world=4 rank=3 wire=fixed32 token=s3cr.t:x port=40000", &err);
  CHECK(r.has_value());
  auto j = parse_join(*r, &err);
  CHECK(j.has_value());
  CHECK(j->job == "train-1");
  CHECK_EQ(j->world, 4);
  CHECK_EQ(j->rank, 3);
  CHECK_EQ(j->wire, GS_ELEM_FIXED32);
  CHECK(j->token == "s3cr.t:x");
  CHECK_EQ(j->port, 40000);
}

TEST(join_invalid) {
  const char* bad[] = {
      "JOIN world=2 rank=0 wire=int32 token=t port=1",            // no job
      "JOIN job=a world=2 rank=0 wire=int32 token=t",             // no port
      "JOIN job=a world=0 rank=0 wire=int32 token=t port=1",      // world 0
      "JOIN job=a world=65 rank=0 wire=int32 token=t port=1",     // world > 64
      "JOIN job=a world=2 rank=2 wire=int32 token=t port=1",      // rank >= world
      "JOIN job=a world=2 rank=0 wire=int8 token=t port=1",       // unknown wire
      "JOIN job=a world=2 rank=0 wire=int32 token=t port=65536",  // port range
      "JOIN job=a world=2 rank=0 wire=int32 token=t port=0",
      "JOIN job=a/b world=2 rank=0 wire=int32 token=t port=1",                   // bad name
      "JOIN job=a world=2 rank=0 wire=int32 token=t port=1 extra=1",             // unknown key
      "JOIN job=a world=18446744073709551616 rank=0 wire=int32 token=t port=1",  // overflow
  };
  for (const char* line : bad) {
    Error err;
    auto r = req(line, &err);
    CHECK(r.has_value());
    CHECK(!parse_join(*r, &err).has_value());
    CHECK(std::string(err.code) == kErrBadRequest);
  }
  Error err;
  std::string long_name = "JOIN job=" + std::string(65, 'a') + " world=1 rank=0 wire=int32 token=t port=1";
  CHECK(!parse_join(*req(long_name, &err), &err).has_value());
}

TEST(join_deadline_keys) {
  Error err;
  auto j =
      parse_join(*req("JOIN job=a world=4 rank=0 wire=float32 token=t port=1 deadline_us=2500", &err), &err);
  CHECK(j.has_value());
  CHECK_EQ(j->deadline_us, 2500u);
  CHECK_EQ(j->quorum, 3);  // default: world - 1
  j = parse_join(*req("JOIN job=a world=4 rank=0 wire=float32 token=t port=1 deadline_us=1 quorum=4", &err),
                 &err);
  CHECK(j.has_value() && j->quorum == 4);
  j = parse_join(*req("JOIN job=a world=1 rank=0 wire=float32 token=t port=1 deadline_us=60000000", &err),
                 &err);
  CHECK(j.has_value() && j->quorum == 1);
  CHECK_EQ(parse_join(*req("JOIN job=a world=4 rank=0 wire=int32 token=t port=1", &err), &err)->deadline_us,
           0u);
  const std::pair<const char*, const char*> bad[] = {
      {"deadline_us=0", "deadline_us=0 is not a number in 1..60000000"},
      {"deadline_us=60000001", "deadline_us=60000001 is not a number in 1..60000000"},
      {"deadline_us=1 quorum=0", "quorum=0 is not a number in 1..4"},
      {"deadline_us=1 quorum=5", "quorum=5 is not a number in 1..4"},
      {"quorum=2", "quorum= needs deadline_us="},
      {"deadline_us=1 leaf=1 peer=10.0.0.1:5", "deadline_us= does not go with leaf=1"},
      {"deadline_us=1 optimizer=sgd params=4 lr=0.1", "deadline_us= does not go with optimizer="},
  };
  for (const auto& [keys, message] : bad) {
    const std::string line = std::string("JOIN job=a world=4 rank=0 wire=float32 token=t port=1 ") + keys;
    CHECK(!parse_join(*req(line, &err), &err).has_value());
    CHECK(std::string(err.code) == kErrBadRequest);
    if (err.message.find(message) != 0) std::fprintf(stderr, "  %s: %s\n", keys, err.message.c_str());
    CHECK(err.message.find(message) == 0);
  }
}

TEST(status_and_stats_args) {
  Error err;
  auto q = parse_status(*req("STATUS job_id=0x101 slot=5 version=1", &err), &err);
  CHECK(q.has_value());
  CHECK(q->job_id && *q->job_id == 0x101);
  CHECK(q->slot && *q->slot == 5);
  CHECK_EQ(q->version, 1);
  CHECK(parse_status(*req("STATUS", &err), &err).has_value());
  CHECK(!parse_status(*req("STATUS slot=1", &err), &err).has_value());  // slot without version
  CHECK(!parse_status(*req("STATUS slot=1 version=2", &err), &err).has_value());
  CHECK(!parse_status(*req("STATUS job_id=4294967296", &err), &err).has_value());
  CHECK(!parse_stats(*req("STATS slot=1 version=0", &err), &err).has_value());
  CHECK(parse_stats(*req("STATS job_id=4294967295", &err), &err).has_value());
  CHECK(parse_no_args(*req("PING", &err), &err));
  CHECK(!parse_no_args(*req("PING a=1", &err), &err));
}

TEST(leave_may_name_the_switch_the_rank_lost) {
  Error err;
  auto l = parse_leave(*req("LEAVE", &err), &err);
  CHECK(l.has_value() && l->lost.empty());
  l = parse_leave(*req("LEAVE lost=10.0.0.7:7700", &err), &err);
  CHECK(l.has_value() && l->lost == "10.0.0.7:7700");
  CHECK(parse_leave(*req("LEAVE lost=[::1]:9", &err), &err).has_value());
  CHECK(parse_leave(*req("LEAVE lost=switch-2.rack_a:7700", &err), &err).has_value());
  // It is written back into STATUS and EVENT lines: only an address passes.
  for (const char* bad : {"LEAVE lost=7700", "LEAVE lost=host:", "LEAVE lost=:7700", "LEAVE lost=host:77a",
                          "LEAVE lost=a=b:1", "LEAVE lost=a,b:1", "LEAVE rank=1"}) {
    CHECK(!parse_leave(*req(bad, &err), &err).has_value());
    CHECK(err.code == std::string(kErrBadRequest));
  }
  CHECK(!parse_leave(*req("LEAVE lost=" + std::string(130, 'a') + ":1", &err), &err).has_value());
  CHECK(err.message.find("not a switch address") != std::string::npos);
}

TEST(numbers_names_wire) {
  CHECK(parse_number("0", 10) == 0u);
  CHECK(parse_number("10", 10) == 10u);
  CHECK(!parse_number("11", 10));
  CHECK(parse_number("0xff", 255) == 255u);
  CHECK(!parse_number("0x", 255));
  CHECK(!parse_number("-1", 255));
  CHECK(!parse_number("1a", 255));
  CHECK(parse_number("18446744073709551615", UINT64_MAX) == UINT64_MAX);
  CHECK(!parse_number("18446744073709551616", UINT64_MAX));
  CHECK(is_valid_name("a.B_c:d-9"));
  CHECK(!is_valid_name(""));
  CHECK(!is_valid_name("a b"));
  CHECK(!is_valid_name(std::string(65, 'x')));
  CHECK(is_valid_key("drop.bad_rank0"));
  CHECK(!is_valid_key("Drop"));
  CHECK_EQ(wire_from_name("bfloat16"), GS_ELEM_BFLOAT16);
  CHECK_EQ(wire_from_name("float64"), GS_ELEM_FLOAT64);
  CHECK_EQ(wire_from_name("int32"), GS_ELEM_INT32);
  CHECK_EQ(wire_from_name("INT32"), 0);
}

TEST(error_line_is_one_line) {
  std::string e = format_error({kErrConflict, "two\nlines\r"});
  CHECK(e == "ERR conflict two lines \n");
}

GS_TEST_MAIN()
