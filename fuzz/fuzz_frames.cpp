// libFuzzer target over the DPDK switch's frame parse (frames.h) and its tables (l2_tables.h):
// any bytes as a received frame. Checks: no crash, no sanitizer report, a datagram handed to
// aggregation lies inside the frame on a data port, a drop has a reason, and what the tables
// return was learned.
#include <cstdint>
#include <cstring>
#include <vector>

#include "switch/io/dpdk/frames.h"
#include "switch/io/dpdk/l2_tables.h"

using namespace gradswitch::dpdk;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static MacTable macs;
  static NeighbourTable neighbours;
  if (size == 0) return 0;
  FrameRules rules;
  rules.agg_ip_be = 0x6400000A;  // 10.0.0.100
  rules.data_port = 7701;
  rules.threads = 1 + data[0] % 4;
  rules.answer_arp = data[0] & 0x80;
  rules.agg_mac.bytes[0] = 0x02;
  std::vector<uint8_t> frame(data + 1, data + size);
  const uint32_t len = static_cast<uint32_t>(frame.size());
  const PacketDescription d = classify_frame(frame.data(), len, rules);
  switch (d.action) {
    case FrameAction::kAggregate:
      if (d.frame_len > len || d.payload_offset + d.payload_len != d.frame_len || d.agg >= rules.threads)
        __builtin_trap();
      break;
    case FrameAction::kArpReply:
      if (len < sizeof(EthernetHeader) + sizeof(ArpHeader)) __builtin_trap();
      break;
    case FrameAction::kDrop:
      if (d.drop == FrameDrop::kNone) __builtin_trap();
      break;
    case FrameAction::kSwitch:
      break;
  }
  if (d.learn_mac) {
    macs.learn(d.src_mac, data[0] % 8, 100, 300);
    if (macs.lookup(d.src_mac, 100, 300) >= 8) __builtin_trap();  // -1 (region full) or the port
  }
  if (d.learn_neighbour) {
    neighbours.learn(d.neighbour_ip_be, d.neighbour_mac, 100);
    MacAddr m;
    if (neighbours.lookup(d.neighbour_ip_be, &m, 100, 300) && !(m == d.neighbour_mac) &&
        d.neighbour_mac.is_unicast_host())
      __builtin_trap();
  }
  return 0;
}
