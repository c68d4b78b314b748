// Frames of the DPDK switch: the Ethernet, IPv4, UDP and ARP headers it reads and writes, the
// parse that decides whether a frame is gradswitch data for the engine, ARP for the aggregation
// address or ordinary traffic to switch, and the encapsulation of results and ARP requests.
//
// Plain bytes in, plain bytes out: nothing here knows mbufs, ports or EAL, so the golden frame
// tables (tests/cpp/test_dpdk_frames.cpp) and the fuzz target drive exactly what the switch runs.
// Addresses and ports are kept in network byte order (`_be`), as they sit in the frame.
#pragma once

#include <cstdint>
#include <string>

namespace gradswitch::dpdk {

struct MacAddr {
  uint8_t bytes[6] = {};
  bool operator==(const MacAddr& o) const;
  bool is_multicast() const { return bytes[0] & 1; }  // broadcast included
  bool is_zero() const;
  // A learnable source: unicast and not all zero.
  bool is_unicast_host() const { return !is_multicast() && !is_zero(); }
};

std::string mac_to_string(const MacAddr& m);  // "0A:1B:..." (upper case, as in the stats file)
std::string ipv4_to_string(uint32_t ip_be);

#pragma pack(push, 1)
struct EthernetHeader {
  MacAddr dst, src;
  uint16_t ether_type_be;
};
struct Ipv4Header {
  uint8_t version_ihl;
  uint8_t tos;
  uint16_t total_length_be;
  uint16_t id_be;
  uint16_t fragment_be;
  uint8_t ttl;
  uint8_t protocol;
  uint16_t checksum;
  uint32_t src_be, dst_be;
};
struct UdpHeader {
  uint16_t src_port_be, dst_port_be, length_be, checksum;
};
struct ArpHeader {
  uint16_t hardware_be, protocol_be;
  uint8_t hardware_len, protocol_len;
  uint16_t opcode_be;
  MacAddr sender_mac;
  uint32_t sender_ip_be;
  MacAddr target_mac;
  uint32_t target_ip_be;
};
#pragma pack(pop)
static_assert(sizeof(EthernetHeader) == 14 && sizeof(Ipv4Header) == 20 && sizeof(UdpHeader) == 8 &&
              sizeof(ArpHeader) == 28);

inline constexpr uint16_t kEtherTypeIpv4 = 0x0800, kEtherTypeArp = 0x0806;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr uint32_t kUdpFrameOverhead = sizeof(EthernetHeader) + sizeof(Ipv4Header) + sizeof(UdpHeader);
inline constexpr uint32_t kMinFrame = 60;  // Ethernet minimum without the CRC

// What the switch intercepts and how it answers: fixed at start-up.
struct FrameRules {
  uint32_t agg_ip_be = 0;     // the aggregation address
  uint16_t data_port = 7701;  // host order; thread k owns data_port + k
  unsigned threads = 1;
  bool answer_arp = false;  // answer ARP requests for agg_ip (no tap port behind it)
  MacAddr agg_mac;          // source of results, ARP replies and requests
};

// What the parse found, and what the switch must do with the frame.
enum class FrameAction : uint8_t {
  kAggregate,  // gradswitch data: hand `payload` to aggregation thread `agg`
  kArpReply,   // the frame was rewritten into the ARP reply: send it back out of its input port
  kSwitch,     // ordinary traffic: switch by destination MAC
  kDrop,       // malformed traffic to the aggregation address: count `drop`
};
enum class FrameDrop : uint8_t { kNone, kRunt, kBadIpv4, kBadUdp, kIpFragment };

struct PacketDescription {
  FrameAction action = FrameAction::kSwitch;
  FrameDrop drop = FrameDrop::kNone;
  // MAC learning: the frame's source (read before an ARP reply rewrites it), when it is a host's.
  bool learn_mac = false;
  MacAddr src_mac;
  // Neighbour learning: a well-formed IPv4 source, or an ARP sender, with the frame's source MAC.
  bool learn_neighbour = false;
  uint32_t neighbour_ip_be = 0;
  MacAddr neighbour_mac;
  // kAggregate: the gradswitch datagram is `payload_len` bytes at `payload_offset`; the UDP port it
  // came to (the source port of its results); the frame's length without Ethernet padding.
  unsigned agg = 0;
  uint16_t payload_offset = 0;
  uint16_t payload_len = 0;
  uint16_t data_port_be = 0;
  uint32_t frame_len = 0;
};

// Parses `len` bytes of a received frame. Rewrites the frame in place only for kArpReply.
PacketDescription classify_frame(uint8_t* frame, uint32_t len, const FrameRules& rules);

// An IPv4/UDP frame around `payload` (`payload_len` bytes) for one receiver.
struct UdpFrameAddress {
  MacAddr dst_mac, src_mac;
  uint32_t src_ip_be = 0, dst_ip_be = 0;
  uint16_t src_port_be = 0, dst_port_be = 0;
  uint16_t ip_id = 0;  // host order
};

// Writes the frame at `out` (room for `room` bytes); returns its length, or 0 when it does not fit.
// `payload_sum` is checksum_add(0, payload, payload_len), shared by every receiver of a result;
// with `udp_checksum` false the UDP checksum is 0 (allowed over IPv4).
uint32_t write_udp_frame(uint8_t* out, uint32_t room, const UdpFrameAddress& a, const uint8_t* payload,
                         uint32_t payload_len, uint64_t payload_sum, bool udp_checksum);

// Writes a broadcast ARP request "who has target_ip? tell agg_ip" (kMinFrame bytes) at `out`.
uint32_t write_arp_request(uint8_t* out, const MacAddr& agg_mac, uint32_t agg_ip_be, uint32_t target_ip_be);

}  // namespace gradswitch::dpdk
