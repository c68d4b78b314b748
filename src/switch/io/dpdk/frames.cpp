// Parsing and building the DPDK switch's frames (frames.h).
#include "switch/io/dpdk/frames.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>

#include "switch/io/dpdk/checksum.h"

namespace gradswitch::dpdk {
namespace {

constexpr uint16_t kIpv4MoreFragments = 0x2000, kIpv4OffsetMask = 0x1FFF, kIpv4DontFragment = 0x4000;
constexpr uint16_t kArpHardwareEthernet = 1, kArpRequest = 1, kArpReply = 2;

PacketDescription dropped(FrameDrop why) {
  PacketDescription d;
  d.action = FrameAction::kDrop;
  d.drop = why;
  return d;
}

// IPv4 to the aggregation address: gradswitch data on a data port, malformed UDP (dropped), or
// anything else (switched, e.g. TCP to the control plane behind the tap port).
PacketDescription classify_to_agg(const uint8_t* frame, const Ipv4Header& ip, bool ip_ok, unsigned ihl,
                                  const FrameRules& rules, PacketDescription d) {
  if (ip.protocol != kIpProtoUdp) return d;
  if (!ip_ok) return dropped(FrameDrop::kBadIpv4);
  const unsigned total = ntohs(ip.total_length_be);
  const bool fragment = (ntohs(ip.fragment_be) & (kIpv4MoreFragments | kIpv4OffsetMask)) != 0;
  // A fragment cannot be checked or summed here (only the first one has the UDP header).
  if (fragment) return dropped(FrameDrop::kIpFragment);
  if (total < ihl + sizeof(UdpHeader)) return d;
  UdpHeader udp;
  std::memcpy(&udp, frame + sizeof(EthernetHeader) + ihl, sizeof udp);
  const unsigned dport = ntohs(udp.dst_port_be);
  if (dport < rules.data_port || dport >= rules.data_port + rules.threads) return d;
  const unsigned ulen = ntohs(udp.length_be);
  if (ulen < sizeof(UdpHeader) || ulen > total - ihl) return dropped(FrameDrop::kBadUdp);
  d.action = FrameAction::kAggregate;
  d.agg = dport - rules.data_port;
  d.payload_offset = static_cast<uint16_t>(sizeof(EthernetHeader) + ihl + sizeof(UdpHeader));
  d.payload_len = static_cast<uint16_t>(ulen - sizeof(UdpHeader));
  d.data_port_be = udp.dst_port_be;
  d.frame_len = sizeof(EthernetHeader) + ihl + ulen;  // without Ethernet padding
  return d;
}

PacketDescription classify_ipv4(const uint8_t* frame, uint32_t len, const FrameRules& rules,
                                PacketDescription d) {
  Ipv4Header ip;
  std::memcpy(&ip, frame + sizeof(EthernetHeader), sizeof ip);
  const unsigned ihl = (ip.version_ihl & 0xF) * 4u;
  const unsigned avail = len - sizeof(EthernetHeader);
  const unsigned total = ntohs(ip.total_length_be);
  const bool ip_ok = (ip.version_ihl >> 4) == 4 && ihl >= sizeof(Ipv4Header) && ihl <= avail &&
                     total >= ihl && total <= avail;
  if (ip_ok) {
    d.learn_neighbour = true;
    d.neighbour_ip_be = ip.src_be;
  }
  if (ip.dst_be != rules.agg_ip_be) return d;
  return classify_to_agg(frame, ip, ip_ok, ihl, rules, d);
}

PacketDescription classify_arp(uint8_t* frame, const FrameRules& rules, PacketDescription d) {
  ArpHeader arp;
  std::memcpy(&arp, frame + sizeof(EthernetHeader), sizeof arp);
  if (arp.hardware_be != htons(kArpHardwareEthernet) || arp.protocol_be != htons(kEtherTypeIpv4)) return d;
  d.learn_neighbour = true;
  d.neighbour_ip_be = arp.sender_ip_be;
  d.neighbour_mac = arp.sender_mac;
  if (!rules.answer_arp || arp.opcode_be != htons(kArpRequest) || arp.target_ip_be != rules.agg_ip_be)
    return d;
  // Turn the request into the reply, in place: it goes back out of the port it came from.
  EthernetHeader eth;
  std::memcpy(&eth, frame, sizeof eth);
  arp.opcode_be = htons(kArpReply);
  arp.target_mac = arp.sender_mac;
  arp.target_ip_be = arp.sender_ip_be;
  arp.sender_mac = rules.agg_mac;
  arp.sender_ip_be = rules.agg_ip_be;
  eth.dst = eth.src;
  eth.src = rules.agg_mac;
  std::memcpy(frame, &eth, sizeof eth);
  std::memcpy(frame + sizeof eth, &arp, sizeof arp);
  d.action = FrameAction::kArpReply;
  return d;
}

}  // namespace

bool MacAddr::operator==(const MacAddr& o) const {
  return std::memcmp(bytes, o.bytes, 6) == 0;
}
bool MacAddr::is_zero() const {
  return *this == MacAddr{};
}

std::string mac_to_string(const MacAddr& m) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02X:%02X:%02X:%02X:%02X:%02X", m.bytes[0], m.bytes[1], m.bytes[2],
                m.bytes[3], m.bytes[4], m.bytes[5]);
  return buf;
}

std::string ipv4_to_string(uint32_t ip_be) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{ip_be};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

PacketDescription classify_frame(uint8_t* frame, uint32_t len, const FrameRules& rules) {
  if (len < sizeof(EthernetHeader)) return dropped(FrameDrop::kRunt);
  EthernetHeader eth;
  std::memcpy(&eth, frame, sizeof eth);
  PacketDescription d;
  d.learn_mac = eth.src.is_unicast_host();
  d.src_mac = eth.src;
  d.neighbour_mac = eth.src;
  d.frame_len = len;
  const uint16_t type = ntohs(eth.ether_type_be);
  if (type == kEtherTypeIpv4 && len >= sizeof(EthernetHeader) + sizeof(Ipv4Header))
    return classify_ipv4(frame, len, rules, d);
  if (type == kEtherTypeArp && len >= sizeof(EthernetHeader) + sizeof(ArpHeader))
    return classify_arp(frame, rules, d);
  return d;
}

uint32_t write_udp_frame(uint8_t* out, uint32_t room, const UdpFrameAddress& a, const uint8_t* payload,
                         uint32_t payload_len, uint64_t payload_sum, bool udp_checksum) {
  const uint32_t len = kUdpFrameOverhead + payload_len;
  if (len > room || payload_len > 0xFFFF - sizeof(Ipv4Header) - sizeof(UdpHeader)) return 0;
  EthernetHeader eth{a.dst_mac, a.src_mac, htons(kEtherTypeIpv4)};
  Ipv4Header ip{};
  ip.version_ihl = 0x45;
  ip.total_length_be = htons(static_cast<uint16_t>(len - sizeof(EthernetHeader)));
  ip.id_be = htons(a.ip_id);
  ip.fragment_be = htons(kIpv4DontFragment);
  ip.ttl = 64;
  ip.protocol = kIpProtoUdp;
  ip.src_be = a.src_ip_be;
  ip.dst_be = a.dst_ip_be;
  ip.checksum = checksum_finish(checksum_add(0, &ip, sizeof ip));
  UdpHeader udp{a.src_port_be, a.dst_port_be, htons(static_cast<uint16_t>(sizeof(UdpHeader) + payload_len)),
                0};
  if (udp_checksum) {
    // Pseudo header: source, destination, zero, protocol, UDP length.
    const uint8_t proto_word[2] = {0, kIpProtoUdp};
    uint64_t sum = payload_sum;
    sum = checksum_add(sum, &ip.src_be, 8);
    sum = checksum_add(sum, proto_word, 2);
    sum = checksum_add(sum, &udp.length_be, 2);
    sum = checksum_add(sum, &udp, sizeof udp);
    const uint16_t ck = checksum_finish(sum);
    udp.checksum = ck ? ck : 0xFFFF;  // 0 would mean "no checksum"
  }
  std::memcpy(out, &eth, sizeof eth);
  std::memcpy(out + sizeof eth, &ip, sizeof ip);
  std::memcpy(out + sizeof eth + sizeof ip, &udp, sizeof udp);
  if (payload_len != 0) std::memcpy(out + kUdpFrameOverhead, payload, payload_len);  // payload may be null
  return len;
}

uint32_t write_arp_request(uint8_t* out, const MacAddr& agg_mac, uint32_t agg_ip_be, uint32_t target_ip_be) {
  EthernetHeader eth;
  std::memset(eth.dst.bytes, 0xFF, 6);
  eth.src = agg_mac;
  eth.ether_type_be = htons(kEtherTypeArp);
  ArpHeader arp{};
  arp.hardware_be = htons(kArpHardwareEthernet);
  arp.protocol_be = htons(kEtherTypeIpv4);
  arp.hardware_len = 6;
  arp.protocol_len = 4;
  arp.opcode_be = htons(kArpRequest);
  arp.sender_mac = agg_mac;
  arp.sender_ip_be = agg_ip_be;
  arp.target_ip_be = target_ip_be;
  std::memset(out, 0, kMinFrame);
  std::memcpy(out, &eth, sizeof eth);
  std::memcpy(out + sizeof eth, &arp, sizeof arp);
  return kMinFrame;
}

}  // namespace gradswitch::dpdk
