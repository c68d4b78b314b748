// Runs the test vectors of docs/protocol.md §6 against the engine, so the specification's examples
// are executed rather than merely written down.
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"

#ifndef GS_PROTOCOL_MD
#define GS_PROTOCOL_MD GS_SOURCE_DIR "/docs/protocol.md"
#endif
#include "switch/engine/engine.h"

using namespace gradswitch;

namespace {

std::vector<uint8_t> parse_hex(const std::string& text) {
  std::vector<uint8_t> out;
  std::string digits;
  for (char c : text)
    if (std::isxdigit(static_cast<unsigned char>(c))) digits += c;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out.push_back(std::stoi(digits.substr(i, 2), nullptr, 16));
  return out;
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i && i % 4 == 0) s += ' ';
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

}  // namespace

TEST(protocol_md_vectors) {
  std::ifstream f(GS_PROTOCOL_MD);
  CHECK(f.good());
  std::string line;
  bool in_block = false;
  int blocks = 0, lines = 0, line_no = 0;
  std::unique_ptr<Engine> engine;
  uint16_t world = 0;  // the current block's
  uint64_t now_ns = 1;
  IngestResult last;
  std::vector<IngestResult> deadlines;  // rounds opened in a job with deadline_us= (§3.1)
  while (std::getline(f, line)) {
    ++line_no;
    if (!in_block) {
      if (line.rfind("```vectors", 0) == 0) in_block = true, ++blocks;
      continue;
    }
    if (line.rfind("```", 0) == 0) {
      in_block = false;
      continue;
    }
    auto fail = [&](const std::string& what) {
      std::fprintf(stderr, "  docs/protocol.md:%d: %s\n", line_no, what.c_str());
      ++gs_test::failures();
    };
    ++lines;
    if (line.rfind("job ", 0) == 0) {
      JobSpec spec;
      std::istringstream in(line.substr(4));
      std::string kv;
      while (in >> kv) {
        auto eq = kv.find('=');
        std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
        if (k == "world")
          spec.world = std::stoi(v);
        else if (k == "slots")
          spec.slots = std::stoi(v);
        else if (k == "payload")
          spec.payload_bytes = std::stoul(v);
        else if (k == "key")
          spec.key = std::stoul(v, nullptr, 16);
        else if (k == "deadline_us")  // §3.1
          spec.deadline_ns = std::stoull(v) * 1000;
        else if (k == "quorum")
          spec.quorum = static_cast<uint16_t>(std::stoi(v));
        else if (k == "wire")
          for (uint8_t t = 1; t < 16; ++t)
            if (v == gs_elem_name(t)) spec.wire = t;
      }
      if (line.find(" wire=") == std::string::npos)
        fail("a job line names its wire (the DATA types it takes)");
      spec.endpoints.resize(spec.world);
      world = spec.world;
      now_ns = 1;
      deadlines.clear();
      engine = std::make_unique<Engine>(EngineConfig{1, 4});
      std::string err;
      if (engine->create_job(spec, &err) != 0x100) fail("job id is not 0x100: " + err);
    } else if (line.rfind("-> ", 0) == 0) {
      auto pkt = parse_hex(line.substr(3));
      last = engine->ingest(0, pkt.data(), pkt.size(), now_ns, Endpoint{});  // every rank joined from {0, 0}
      if (last.deadline_ns) deadlines.push_back(last);
    } else if (line.rfind("at ", 0) == 0) {  // the switch's clock, in ms, for the datagrams that follow
      now_ns = std::stoull(line.substr(3)) * 1'000'000;
      // Rounds whose deadline has passed close now, as a backend's timer closes them (§3.1): what
      // they send is what the next `<-` line checks.
      last = IngestResult{};
      for (const IngestResult& d : deadlines)
        if (d.deadline_ns <= now_ns) {
          const IngestResult r =
              engine->close_overdue(0, d.job_id, d.slot, d.version, d.seq, d.offset, now_ns);
          if (r.kind == IngestResult::kSend) last = r;
        }
      std::erase_if(deadlines, [&](const IngestResult& d) { return d.deadline_ns <= now_ns; });
    } else if (line.rfind("<- none", 0) == 0) {
      if (last.kind == IngestResult::kSend)
        fail("expected nothing, the switch sent " + hex(last.data, last.len));
    } else if (line.rfind("<- ", 0) == 0) {
      std::istringstream in(line.substr(3));
      std::string who;
      in >> who;
      // The destinations as destinations() gives them (every rank joined in rank order).
      uint64_t dests = world >= 64 ? ~uint64_t{0} : (uint64_t{1} << world) - 1;
      if (who == "rank" || who == "ranks") {
        dests = 0;
        std::string list;
        in >> list;
        std::istringstream ranks(list);
        for (std::string r; std::getline(ranks, r, ',');) dests |= uint64_t{1} << std::stoi(r);
      }
      std::string rest;
      std::getline(in, rest);
      auto want = parse_hex(rest);
      if (last.kind != IngestResult::kSend) {
        fail("expected a packet, the switch sent nothing");
      } else if (destinations(last) != dests) {
        fail("wrong destination");
      } else if (last.len != want.size() || std::memcmp(last.data, want.data(), want.size()) != 0) {
        fail("expected " + hex(want.data(), want.size()) + "\n    got      " + hex(last.data, last.len));
      }
    } else if (!line.empty()) {
      fail("unrecognised vector line: " + line);
    }
  }
  std::printf("  %d vector blocks, %d lines\n", blocks, lines);
  CHECK(blocks >= 3);
}

GS_TEST_MAIN()
