// gs_dpdk_probe: checks that DPDK's EAL starts here and that every port it was given comes up.
//
//   gs_dpdk_probe --no-huge --no-pci --vdev=net_af_xdp0,iface=veth0 [-- seconds]
//
// Prints one line per port (driver, MAC, link) and, when `seconds` > 0, the frames received on
// each port during that time. Exit status 0 when EAL and all ports started.
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  int used = rte_eal_init(argc, argv);
  if (used < 0) {
    std::fprintf(stderr, "gs_dpdk_probe: rte_eal_init failed: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  argc -= used;
  argv += used;
  double seconds = argc > 1 ? std::atof(argv[1]) : 0.0;
  uint16_t nports = rte_eth_dev_count_avail();
  std::printf("eal ok: lcores=%u ports=%u socket=%d\n", rte_lcore_count(), nports, rte_socket_id());
  rte_mempool* pool =
      rte_pktmbuf_pool_create("probe_pool", 8191, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
  if (!pool) {
    std::fprintf(stderr, "gs_dpdk_probe: mempool: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  int rc = 0;
  uint16_t port;
  RTE_ETH_FOREACH_DEV(port) {
    rte_eth_dev_info info;
    rte_eth_dev_info_get(port, &info);
    rte_eth_conf conf{};
    int r = rte_eth_dev_configure(port, 1, 1, &conf);
    if (r == 0) r = rte_eth_rx_queue_setup(port, 0, 1024, rte_eth_dev_socket_id(port), nullptr, pool);
    if (r == 0) r = rte_eth_tx_queue_setup(port, 0, 1024, rte_eth_dev_socket_id(port), nullptr);
    if (r == 0) r = rte_eth_dev_start(port);
    if (r == 0) rte_eth_promiscuous_enable(port);
    rte_ether_addr mac;
    rte_eth_macaddr_get(port, &mac);
    rte_eth_link link;
    rte_eth_link_get_nowait(port, &link);
    char macs[RTE_ETHER_ADDR_FMT_SIZE];
    rte_ether_format_addr(macs, sizeof macs, &mac);
    std::printf("port %u: driver=%s mac=%s link=%s speed=%u max_rx_pktlen=%u start=%s\n", port,
                info.driver_name, macs, link.link_status ? "up" : "down", link.link_speed, info.max_rx_pktlen,
                r == 0 ? "ok" : rte_strerror(-r));
    if (r != 0) rc = 1;
  }
  if (seconds > 0 && rc == 0) {
    uint64_t end = rte_get_timer_cycles() + (uint64_t)(seconds * rte_get_timer_hz());
    uint64_t counts[RTE_MAX_ETHPORTS] = {};
    rte_mbuf* bufs[32];
    while (rte_get_timer_cycles() < end) {
      RTE_ETH_FOREACH_DEV(port) {
        uint16_t n = rte_eth_rx_burst(port, 0, bufs, 32);
        counts[port] += n;
        rte_pktmbuf_free_bulk(bufs, n);
      }
    }
    RTE_ETH_FOREACH_DEV(port) std::printf("port %u: rx %lu frames\n", port, (unsigned long)counts[port]);
  }
  RTE_ETH_FOREACH_DEV(port) {
    rte_eth_dev_stop(port);
    rte_eth_dev_close(port);
  }
  rte_eal_cleanup();
  return rc;
}
