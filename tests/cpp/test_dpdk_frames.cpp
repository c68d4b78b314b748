// Golden frame tables of the DPDK switch (frames.h, l2_tables.h): an input frame on a port ->
// the frames that leave (port and exact bytes) or the datagram the engine gets, for intercepted
// data, switched traffic (forward, flood, filter), ARP and malformed frames; and the frames the
// switch builds (results, ARP requests), checked against bytes written here independently.
//
// The test applies each decision the way burst_loop.cpp does (learn the source, then act), over
// the real tables, so a row says what the switch does with that frame.
#include <arpa/inet.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "switch/io/dpdk/checksum.h"
#include "switch/io/dpdk/frames.h"
#include "switch/io/dpdk/l2_tables.h"

using namespace gradswitch::dpdk;
using Bytes = std::vector<uint8_t>;

namespace {

constexpr unsigned kPorts = 3;
const Bytes kMacA = {0x02, 0, 0, 0, 0, 0x0a}, kMacB = {0x02, 0, 0, 0, 0, 0x0b},
            kMacC = {0x02, 0, 0, 0, 0, 0x0c};
const Bytes kAggMac = {0x02, 0, 0, 0, 0, 0xaa}, kBroadcast = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
const Bytes kMulticast = {0x01, 0x00, 0x5e, 0, 0, 1}, kUnknown = {0x02, 0, 0, 0, 0, 0x77};
const Bytes kIpA = {10, 0, 0, 1}, kIpB = {10, 0, 0, 2}, kAggIp = {10, 0, 0, 100};

// ---- frames written byte by byte, big-endian, without the code under test ----
void put16(Bytes& b, unsigned v) {
  b.push_back(uint8_t(v >> 8));
  b.push_back(uint8_t(v));
}
Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
// RFC 1071 over big-endian words, the textbook way.
uint16_t internet_checksum(const Bytes& b) {
  uint32_t s = 0;
  for (size_t i = 0; i < b.size(); i += 2) s += (uint32_t(b[i]) << 8) | (i + 1 < b.size() ? b[i + 1] : 0);
  while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
  return uint16_t(~s);
}
Bytes ethernet(const Bytes& dst, const Bytes& src, unsigned type) {
  Bytes b = cat({dst, src});
  put16(b, type);
  return b;
}
struct Ip {
  unsigned ihl_words = 5, version = 4, frag = 0, proto = 17;
  int total = -1;  // -1: header + payload
};
Bytes ipv4(const Bytes& src, const Bytes& dst, const Bytes& payload, Ip o = {}) {
  Bytes h = {uint8_t(o.version << 4 | o.ihl_words), 0};
  put16(h, o.total >= 0 ? unsigned(o.total) : 20 + payload.size());
  put16(h, 1);
  put16(h, o.frag);
  h.push_back(64);
  h.push_back(uint8_t(o.proto));
  put16(h, 0);
  h = cat({h, src, dst});
  const uint16_t ck = internet_checksum(h);
  h[10] = uint8_t(ck >> 8), h[11] = uint8_t(ck);
  return cat({h, payload});
}
Bytes udp(unsigned sport, unsigned dport, const Bytes& payload, int length = -1) {
  Bytes b;
  put16(b, sport);
  put16(b, dport);
  put16(b, length >= 0 ? unsigned(length) : 8 + payload.size());
  put16(b, 0);
  return cat({b, payload});
}
Bytes arp(unsigned op, const Bytes& sha, const Bytes& sip, const Bytes& tha, const Bytes& tip) {
  Bytes b;
  put16(b, 1);
  put16(b, 0x0800);
  b.push_back(6);
  b.push_back(4);
  put16(b, op);
  return cat({b, sha, sip, tha, tip});
}
Bytes pad60(Bytes f) {
  if (f.size() < 60) f.resize(60, 0);
  return f;
}
Bytes datagram(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + 7 * i);
  return b;
}

MacAddr mac(const Bytes& b) {
  MacAddr m;
  std::memcpy(m.bytes, b.data(), 6);
  return m;
}
uint32_t ip_be(const Bytes& b) {
  uint32_t v;
  std::memcpy(&v, b.data(), 4);
  return v;
}

// ---- the switch, as burst_loop.cpp applies a decision ----
struct Output {
  int port;  // -1: to aggregation thread `agg`
  unsigned agg;
  Bytes bytes;
  bool operator==(const Output& o) const { return port == o.port && agg == o.agg && bytes == o.bytes; }
};

struct Model {
  FrameRules rules;
  MacTable macs;
  NeighbourTable neighbours;
  uint32_t now_s = 1000;
  unsigned drops[5] = {};

  Model() {
    rules.agg_ip_be = ip_be(kAggIp);
    rules.data_port = 7701;
    rules.threads = 2;
    rules.answer_arp = true;
    rules.agg_mac = mac(kAggMac);
  }
  std::vector<Output> input(unsigned port, Bytes frame) {
    std::vector<Output> out;
    const PacketDescription d = classify_frame(frame.data(), uint32_t(frame.size()), rules);
    if (d.learn_mac) macs.learn(d.src_mac, port, now_s, 300);
    if (d.learn_neighbour) neighbours.learn(d.neighbour_ip_be, d.neighbour_mac, now_s);
    switch (d.action) {
      case FrameAction::kAggregate:
        if (d.frame_len > frame.size() || d.payload_offset + d.payload_len != d.frame_len)
          ++drops[0];  // never
        out.push_back({-1, d.agg, Bytes(frame.begin() + d.payload_offset, frame.begin() + d.frame_len)});
        break;
      case FrameAction::kArpReply:
        out.push_back({int(port), 0, frame});
        break;
      case FrameAction::kDrop:
        ++drops[int(d.drop)];
        break;
      case FrameAction::kSwitch: {
        const L2Destination to = l2_destination(macs, mac(frame), port, now_s, 300);
        if (to.kind == L2Destination::kForward) out.push_back({int(to.port), 0, frame});
        if (to.kind == L2Destination::kFlood)
          for (unsigned q = 0; q < kPorts; ++q)
            if (q != port) out.push_back({int(q), 0, frame});
        break;
      }
    }
    return out;
  }
};

struct Row {
  const char* name;
  unsigned in_port;
  Bytes frame;
  std::vector<Output> expect;
  FrameDrop drop = FrameDrop::kNone;  // the counter a dropped frame bumps
};

std::vector<Output> flood_from(unsigned in, const Bytes& f) {
  std::vector<Output> out;
  for (unsigned q = 0; q < kPorts; ++q)
    if (q != in) out.push_back({int(q), 0, f});
  return out;
}

void run_rows(Model& m, const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    unsigned before[5];
    std::memcpy(before, m.drops, sizeof before);
    const std::vector<Output> got = m.input(r.in_port, r.frame);
    bool ok = got == r.expect;
    for (int i = 0; i < 5; ++i) ok = ok && m.drops[i] == before[i] + (i != 0 && i == int(r.drop) ? 1u : 0u);
    if (!ok) {
      std::fprintf(stderr, "  row '%s': %zu outputs (expected %zu)", r.name, got.size(), r.expect.size());
      for (const Output& o : got)
        std::fprintf(stderr, " [port %d agg %u, %zu bytes]", o.port, o.agg, o.bytes.size());
      std::fprintf(stderr, "\n");
      ++gs_test::failures();
    }
  }
}

}  // namespace

TEST(golden_frames_intercept_switch_arp_and_malformed) {
  Model m;
  const Bytes gs = datagram(40, 3);    // a gradswitch datagram (header + 8 bytes)
  const Bytes small = datagram(4, 9);  // short enough to need Ethernet padding
  const Bytes eth_a_agg = ethernet(kAggMac, kMacA, 0x0800);
  const Bytes data0 = cat({eth_a_agg, ipv4(kIpA, kAggIp, udp(40000, 7701, gs))});
  const Bytes data1_padded = pad60(cat({eth_a_agg, ipv4(kIpA, kAggIp, udp(40000, 7702, small))}));
  const Bytes other_port = cat({eth_a_agg, ipv4(kIpA, kAggIp, udp(40000, 9999, gs))});
  const Bytes tcp_to_agg = cat({eth_a_agg, ipv4(kIpA, kAggIp, Bytes(20, 0x11), Ip{.proto = 6})});
  const Bytes a_to_b = cat({ethernet(kMacB, kMacA, 0x0800), ipv4(kIpA, kIpB, udp(1, 2, gs))});
  const Bytes b_speaks = pad60(cat({ethernet(kUnknown, kMacB, 0x88B5), Bytes{'h', 'i'}}));
  const Bytes b_to_b = pad60(cat({ethernet(kMacB, kMacC, 0x88B5), Bytes{'x'}}));
  const Bytes bcast = pad60(ethernet(kBroadcast, kMacA, 0x88B5));
  const Bytes mcast = pad60(ethernet(kMulticast, kMacA, 0x88B5));
  const Bytes arp_for_agg =
      pad60(cat({ethernet(kBroadcast, kMacB, 0x0806), arp(1, kMacB, kIpB, Bytes(6, 0), kAggIp)}));
  const Bytes arp_reply =
      pad60(cat({ethernet(kMacB, kAggMac, 0x0806), arp(2, kAggMac, kAggIp, kMacB, kIpB)}));
  const Bytes arp_for_a =
      pad60(cat({ethernet(kBroadcast, kMacB, 0x0806), arp(1, kMacB, kIpB, Bytes(6, 0), kIpA)}));
  const Bytes runt(13, 0x42);
  const Bytes short_ipv4 = cat({eth_a_agg, Bytes(10, 0x45)});  // too short for an IPv4 header: switched
  auto to_agg = [&](const Ip& o, const Bytes& payload) {
    return cat({eth_a_agg, ipv4(kIpA, kAggIp, payload, o)});
  };

  run_rows(
      m,
      {
          // Data on thread 0's and thread 1's port: the datagram, without Ethernet padding.
          {"data to thread 0", 0, data0, {{-1, 0, gs}}},
          {"padded data to thread 1", 0, data1_padded, {{-1, 1, small}}},
          // To the aggregation address but not gradswitch data: switched like anything else
          // (the agg MAC is nobody's port here, so flooded).
          {"UDP to another port of the agg address", 0, other_port, flood_from(0, other_port)},
          {"TCP to the agg address", 0, tcp_to_agg, flood_from(0, tcp_to_agg)},
          // L2: A was learned on port 0 by the rows above; B speaks on port 1.
          {"unknown unicast floods", 1, b_speaks, flood_from(1, b_speaks)},
          {"known unicast forwards", 0, a_to_b, {{1, 0, a_to_b}}},
          {"destination on the input port is filtered", 1, b_to_b, {}},
          {"broadcast floods", 0, bcast, flood_from(0, bcast)},
          {"multicast floods", 0, mcast, flood_from(0, mcast)},
          // ARP for the aggregation address is answered out of the input port.
          {"ARP request for the agg address", 1, arp_for_agg, {{1, 0, arp_reply}}},
          {"ARP request for a host floods", 1, arp_for_a, flood_from(1, arp_for_a)},
          // Malformed traffic to the aggregation address: dropped and counted.
          {"runt", 0, runt, {}, FrameDrop::kRunt},
          {"IPv4 header cut short", 0, short_ipv4, flood_from(0, short_ipv4)},
          {"bad IHL", 0, to_agg(Ip{.ihl_words = 3}, udp(1, 7701, gs)), {}, FrameDrop::kBadIpv4},
          {"IP version 6 in an IPv4 frame",
           0,
           to_agg(Ip{.version = 6}, udp(1, 7701, gs)),
           {},
           FrameDrop::kBadIpv4},
          {"total length past the frame",
           0,
           to_agg(Ip{.total = 2000}, udp(1, 7701, gs)),
           {},
           FrameDrop::kBadIpv4},
          {"total length below the IHL",
           0,
           to_agg(Ip{.total = 12}, udp(1, 7701, gs)),
           {},
           FrameDrop::kBadIpv4},
          {"UDP length past the IP payload", 0, to_agg({}, udp(1, 7701, gs, 3000)), {}, FrameDrop::kBadUdp},
          {"UDP length below its header", 0, to_agg({}, udp(1, 7701, gs, 4)), {}, FrameDrop::kBadUdp},
          {"first fragment (MF)",
           0,
           to_agg(Ip{.frag = 0x2000}, udp(1, 7701, gs)),
           {},
           FrameDrop::kIpFragment},
          {"later fragment (offset)", 0, to_agg(Ip{.frag = 0x0010}, gs), {}, FrameDrop::kIpFragment},
      });
  // Learning: MACs on their ports, IPv4 sources and ARP senders as neighbours.
  CHECK(m.macs.lookup(mac(kMacA), m.now_s, 300) == 0);
  CHECK(m.macs.lookup(mac(kMacB), m.now_s, 300) == 1);
  CHECK(m.macs.lookup(mac(kMacC), m.now_s, 300) == 1);  // C sent from port 1 (the filtered row)
  MacAddr n;
  CHECK(m.neighbours.lookup(ip_be(kIpA), &n, m.now_s, 300) && n == mac(kMacA));
  CHECK(m.neighbours.lookup(ip_be(kIpB), &n, m.now_s, 300) && n == mac(kMacB));
  CHECK(!m.neighbours.lookup(ip_be(kAggIp), &n, m.now_s, 300));
  CHECK(m.neighbours.live(m.now_s, 300) == 2 && m.neighbours.live(m.now_s + 301, 300) == 0);
  std::string dump;
  m.neighbours.dump(&dump, m.now_s, 300);
  CHECK(dump.size() == 2 * std::string("neigh.10.0.0.1=02:00:00:00:00:0A\n").size());
  CHECK(dump.find("neigh.10.0.0.1=02:00:00:00:00:0A\n") != std::string::npos);
  CHECK(dump.find("neigh.10.0.0.2=02:00:00:00:00:0B\n") != std::string::npos);
  CHECK(m.macs.lookup(mac(kAggMac), m.now_s, 300) == -1);  // the ARP reply's source is not learned
}

TEST(without_answer_arp_the_request_is_switched) {
  Model m;
  m.rules.answer_arp = false;  // a tap port's kernel answers instead
  const Bytes req =
      pad60(cat({ethernet(kBroadcast, kMacB, 0x0806), arp(1, kMacB, kIpB, Bytes(6, 0), kAggIp)}));
  run_rows(m, {{"ARP request for the agg address, not answering", 2, req, flood_from(2, req)}});
}

TEST(entries_age_out) {
  Model m;
  m.input(0, pad60(ethernet(kBroadcast, kMacA, 0x88B5)));
  CHECK(m.macs.lookup(mac(kMacA), m.now_s + 300, 300) == 0);
  CHECK(m.macs.lookup(mac(kMacA), m.now_s + 301, 300) == -1);  // aged: unknown again (flooded)
  CHECK(m.macs.live(m.now_s, 300) == 1 && m.macs.live(m.now_s + 301, 300) == 0);
  std::string dump;
  m.macs.dump(&dump, m.now_s, 300);
  CHECK(dump == "mac.02:00:00:00:00:0A=0\n");
  // A moved host is learned on its new port.
  CHECK(m.macs.learn(mac(kMacA), 2, m.now_s, 300));
  CHECK(m.macs.lookup(mac(kMacA), m.now_s, 300) == 2);
}

TEST(result_frames_match_independent_bytes) {
  UdpFrameAddress a;
  a.dst_mac = mac({0x02, 0, 0, 0, 0, 0x01});
  a.src_mac = mac(kAggMac);
  a.src_ip_be = ip_be(kAggIp);
  a.dst_ip_be = ip_be(kIpA);
  a.src_port_be = htons(7701);
  a.dst_port_be = htons(9000);
  a.ip_id = 0x1234;
  auto build = [&](const Bytes& payload, bool ck) {
    Bytes out(1600);
    const uint32_t n =
        write_udp_frame(out.data(), uint32_t(out.size()), a, payload.data(), uint32_t(payload.size()),
                        checksum_add(0, payload.data(), payload.size()), ck);
    out.resize(n);
    return out;
  };
  auto hex = [](const char* s) {
    Bytes b;
    for (size_t i = 0; s[i] && s[i + 1]; i += 2)
      b.push_back(uint8_t(std::stoul(std::string(s + i, 2), nullptr, 16)));
    return b;
  };
  // Written once with an independent tool (Python's struct and a textbook checksum).
  CHECK(build({'g', 'r', 'a', 'd', 's', 'w', 'i', 't', 'c', 'h'}, true) ==
        hex("0200000000010200000000aa080045000026123440004011142f0a0000640a0000011e1523280012a0fd677261647377"
            "69746368"));
  CHECK(build({'a', 'b', 'c'}, true) ==  // odd length: the last byte is padded for the checksum
        hex("0200000000010200000000aa08004500001f12344000401114360a0000640a0000011e152328000be5d3616263"));
  // Any payload: the IPv4 header sums to 0, the UDP checksum verifies with its pseudo header.
  for (size_t len : {0, 1, 2, 31, 32, 1440, 1441}) {
    const Bytes payload = datagram(len, uint8_t(len));
    const Bytes f = build(payload, true);
    CHECK(f.size() == 42 + len);
    CHECK(internet_checksum(Bytes(f.begin() + 14, f.begin() + 34)) == 0);
    Bytes pseudo = cat({kAggIp, kIpA, Bytes{0, 17}});
    put16(pseudo, 8 + len);
    CHECK(internet_checksum(cat({pseudo, Bytes(f.begin() + 34, f.end())})) == 0);
    CHECK(Bytes(f.begin() + 42, f.end()) == payload);
  }
  // Checksum off: 0. A sum that comes out 0 is sent as 0xFFFF (0 means "none").
  const Bytes off = build({'x', 'y'}, false);
  CHECK(off[40] == 0 && off[41] == 0);
  for (unsigned v = 0; v < 65536; ++v) {
    const Bytes p = {uint8_t(v >> 8), uint8_t(v)};
    Bytes f = build(p, true);
    Bytes pseudo = cat({kAggIp, kIpA, Bytes{0, 17}});
    put16(pseudo, 10);
    Bytes seg(f.begin() + 34, f.end());
    seg[6] = seg[7] = 0;
    if (internet_checksum(cat({pseudo, seg})) != 0) continue;
    CHECK(f[40] == 0xFF && f[41] == 0xFF);
    break;
  }
  // No room: nothing written.
  Bytes tiny(41);
  CHECK(write_udp_frame(tiny.data(), 41, a, nullptr, 0, 0, true) == 0);
}

TEST(arp_request_bytes) {
  Bytes out(64, 0xEE);
  CHECK(write_arp_request(out.data(), mac(kAggMac), ip_be(kAggIp), ip_be(kIpB)) == 60);
  out.resize(60);
  CHECK(out ==
        pad60(cat({ethernet(kBroadcast, kAggMac, 0x0806), arp(1, kAggMac, kAggIp, Bytes(6, 0), kIpB)})));
}

TEST(checksum_fold_carries) {
  CHECK(checksum_fold(0x1FFFEull) == 0xFFFF);
  CHECK(checksum_fold(0xFFFFFFFFFFFFull) == 0xFFFF);
  CHECK(checksum_finish(checksum_add(0, "\x45\x00", 2)) == uint16_t(~0x0045));  // little-endian host word
}

GS_TEST_MAIN()
