// Port set-up of the DPDK switch (ports.h).
#include "switch/io/dpdk/ports.h"

#include <net/if.h>
#include <rte_errno.h>
#include <rte_mbuf.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "switch/config.h"
#include "switch/log.h"

namespace gradswitch::dpdk {
namespace {

// The kernel side of a tap has its own MAC: that is the one that answers ARP for the address.
void read_kernel_mac(const std::string& iface, MacAddr* mac) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return;
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", iface.c_str());
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) == 0) std::memcpy(mac->bytes, ifr.ifr_hwaddr.sa_data, 6);
  close(fd);
}

// Reads what the driver says about the port; false when its frames are too small for --mtu.
bool describe_port(uint16_t pid, unsigned frame, Port* p, std::string* error) {
  rte_eth_dev_info info;
  int r = rte_eth_dev_info_get(pid, &info);
  if (r != 0) return *error = "rte_eth_dev_info_get(" + std::to_string(pid) + "): " + rte_strerror(-r), false;
  p->id = pid;
  p->driver = info.driver_name ? info.driver_name : "?";
  char name[IF_NAMESIZE] = {};
  if (info.if_index && if_indextoname(info.if_index, name)) p->iface = name;
  char devname[RTE_ETH_NAME_MAX_LEN] = {};
  rte_eth_dev_get_name_by_port(pid, devname);
  if (p->iface.empty()) p->iface = devname;
  p->local = p->driver == "net_tap";
  if (!info.max_rx_pktlen || info.max_rx_pktlen >= frame) return true;
  // af_xdp really is limited (one page per frame); af_packet reports 1518 but takes what its ring
  // frames (framesz) hold, so only warn for the others.
  if (p->driver != "net_af_xdp") {
    GS_LOG_WARN(
        "dpdk: port %u (%s) reports frames up to %u bytes, --mtu needs %u: check the vdev's frame size", pid,
        p->driver.c_str(), info.max_rx_pktlen, frame);
    return true;
  }
  *error = "port " + std::to_string(pid) + " (" + p->driver + ") takes frames up to " +
           std::to_string(info.max_rx_pktlen) + " bytes, the MTU needs " + std::to_string(frame) +
           ": use net_af_packet for jumbo frames";
  return false;
}

bool start_port(const PortSettings& s, unsigned data_room, Port* p, std::string* error) {
  const uint16_t pid = p->id;
  const int socket_id = rte_eth_dev_socket_id(pid);
  const std::string pool_name = "gs_pool" + std::to_string(pid);
  p->pool = rte_pktmbuf_pool_create(pool_name.c_str(), s.mbufs, 256, 0, data_room, socket_id);
  if (!p->pool)
    return *error = "mbuf pool for port " + std::to_string(pid) + ": " + rte_strerror(rte_errno) +
                    " (with --no-huge give EAL more memory: -m 512, or fewer --mbufs)",
           false;
  rte_eth_conf conf{};
  conf.rxmode.mtu = s.mtu;
  int r = rte_eth_dev_configure(pid, 1, 1, &conf);
  if (r != 0) {
    conf.rxmode.mtu = 0;  // some virtual PMDs refuse an MTU; frames are sized by the pool then
    r = rte_eth_dev_configure(pid, 1, 1, &conf);
  }
  uint16_t nrx = s.rx_desc, ntx = s.tx_desc;
  if (r == 0) r = rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nrx, &ntx);
  if (r == 0) r = rte_eth_rx_queue_setup(pid, 0, nrx, socket_id, nullptr, p->pool);
  if (r == 0) r = rte_eth_tx_queue_setup(pid, 0, ntx, socket_id, nullptr);
  if (r == 0) r = rte_eth_dev_start(pid);
  if (r != 0)
    return *error = "port " + std::to_string(pid) + " (" + p->driver + " " + p->iface +
                    "): setup failed: " + rte_strerror(-r),
           false;
  rte_eth_promiscuous_enable(pid);  // a switch port takes every frame (a no-op for some vdevs)
  rte_ether_addr mac;
  rte_eth_macaddr_get(pid, &mac);
  std::memcpy(p->mac.bytes, mac.addr_bytes, 6);
  if (p->local) read_kernel_mac(p->iface, &p->mac);
  const std::string ring_name = "gs_tx" + std::to_string(pid);
  p->tx_ring = rte_ring_create(ring_name.c_str(), s.ring_size, socket_id, RING_F_SC_DEQ);
  if (!p->tx_ring) return *error = "tx ring: " + std::string(rte_strerror(rte_errno)), false;
  return true;
}

}  // namespace

bool open_ports(const PortSettings& s, unsigned max_ports, std::vector<Port>* ports, std::string* error) {
  const uint16_t n = rte_eth_dev_count_avail();
  if (n == 0)
    return *error =
               "DPDK found no ports: pass --vdev=net_af_xdp0,iface=IFACE (one per host) or -a PCI-ADDRESS",
           false;
  if (n > max_ports) return *error = "too many ports (max " + std::to_string(max_ports) + ")", false;
  const unsigned frame = s.mtu + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
  // Jumbo frames: af_packet wants the whole ring frame (framesz, e.g. 12288) to fit in an mbuf.
  const unsigned data_room = frame + RTE_PKTMBUF_HEADROOM <= RTE_MBUF_DEFAULT_BUF_SIZE
                                 ? RTE_MBUF_DEFAULT_BUF_SIZE
                                 : std::max<unsigned>(16384, frame) + RTE_PKTMBUF_HEADROOM;
  uint16_t pid;
  RTE_ETH_FOREACH_DEV(pid) {
    Port p;
    if (!describe_port(pid, frame, &p, error)) return false;
    const bool ok = start_port(s, data_room, &p, error);
    if (p.pool) ports->push_back(p);  // started or not, close_ports() cleans it up
    if (!ok) return false;
  }
  return true;
}

void close_ports(std::vector<Port>* ports) {
  for (const Port& p : *ports) {
    rte_eth_dev_stop(p.id);
    rte_eth_dev_close(p.id);
  }
  ports->clear();
}

bool assign_tap_address(const std::string& iface, uint32_t ip_be, unsigned prefix, std::string* error) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return *error = "socket: " + std::string(strerror(errno)), false;
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", iface.c_str());
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = ip_be;
  bool ok = ioctl(fd, SIOCSIFADDR, &ifr) == 0;
  if (ok) {
    sin->sin_addr.s_addr = prefix ? htonl(~0u << (32 - prefix)) : 0;
    ok = ioctl(fd, SIOCSIFNETMASK, &ifr) == 0;
  }
  if (ok) ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    ifr.ifr_flags |= IFF_UP;
    ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  }
  if (!ok)
    *error = "cannot assign " + ipv4_to_string(ip_be) + " to tap interface " + iface + ": " + strerror(errno);
  close(fd);
  return ok;
}

}  // namespace gradswitch::dpdk
