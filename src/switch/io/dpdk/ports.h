// The DPDK switch's ports: every ethdev EAL found (one per attached host), started with one RX and
// one TX queue, its mbuf pool and its TX ring. A net_tap port is the local port: its kernel side
// is an interface of this process's network namespace, given the aggregation address so that the
// TCP control plane answers through the switch (docs/dpdk.md).
#pragma once

#include <rte_ethdev.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include <cstdint>
#include <string>
#include <vector>

#include "switch/io/dpdk/frames.h"

namespace gradswitch::dpdk {

struct Port {
  uint16_t id = 0;
  std::string driver, iface;
  MacAddr mac;
  bool local = false;  // net_tap: the switch host's own kernel stack sits behind it
  rte_mempool* pool = nullptr;
  rte_ring* tx_ring = nullptr;  // frames for this port from lcores that do not transmit on it
};

struct PortSettings {
  unsigned mtu = 1500;
  unsigned mbufs = 8191;
  unsigned ring_size = 4096;
  unsigned rx_desc = 1024, tx_desc = 1024;
};

// Configures and starts every port (at most `max_ports`). On failure `error` says what to check;
// the ports started so far are in `ports` (close_ports stops them).
bool open_ports(const PortSettings& settings, unsigned max_ports, std::vector<Port>* ports,
                std::string* error);
void close_ports(std::vector<Port>* ports);

// Gives the tap interface `iface` the address ip/prefix and brings it up (ioctl, needs
// CAP_NET_ADMIN in this namespace).
bool assign_tap_address(const std::string& iface, uint32_t ip_be, unsigned prefix, std::string* error);

}  // namespace gradswitch::dpdk
