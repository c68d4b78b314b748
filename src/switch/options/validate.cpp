// Checks of a whole configuration (validate.h).
#include "switch/options/validate.h"

#include "switch/options/option_table.h"
#include "switch/options/values.h"

namespace gradswitch {

std::string validate_config(const SwitchConfig& c) {
  // Redis' protected mode: a switch others can reach does not serve them anonymously by accident.
  if (!option_values::is_loopback_ipv4(c.control_host) && c.auth_file.empty() && !c.insecure)
    return "--control-host " + c.control_host +
           " can be reached from other machines: give --auth-file FILE (tenants and their secrets, "
           "docs/security.md), or --insecure to let anyone who reaches it join, read and abort any job";
  // With an auth file /metrics needs a bearer token (docs/observability.md); without one it answers
  // anyone, which is loopback's trust and nobody else's.
  if (c.metrics_port != 0 && !option_values::is_loopback_ipv4(c.metrics_host) && c.auth_file.empty() &&
      !c.insecure)
    return "--metrics-host " + c.metrics_host +
           " can be reached from other machines, and without --auth-file /metrics shows every job to "
           "anyone: give --auth-file FILE (scrapes then need a bearer token, docs/observability.md), keep "
           "it on loopback, or give --insecure";
  if (c.backend != "dpdk") {
    const SwitchConfig defaults;
    for (const OptionSpec& o : switch_options())
      if (std::string(o.group) == "dpdk" && o.get(c) != o.get(defaults))
        return std::string("--") + o.name + " is an option of the DPDK backend: add --backend dpdk";
  }
  if (!c.uplink.empty() && c.backend != "udp")
    return "--uplink needs --backend udp (the DPDK backend has no uplink)";
  if (!c.uplink.empty() && c.threads != 1)
    return "--uplink needs --threads 1 (the spine answers a leaf on one UDP port)";
  if (c.data_port + c.threads - 1 > 65535)
    return "--data-port " + std::to_string(c.data_port) + " with --threads " + std::to_string(c.threads) +
           " needs UDP ports beyond 65535";
  if (c.metrics_port != 0 && c.metrics_port == c.control_port)
    return "--metrics-port " + std::to_string(c.metrics_port) + " is the control port: choose another one";
  if (c.control_port >= c.data_port && c.control_port < c.data_port + c.threads)
    return "--control-port " + std::to_string(c.control_port) + " overlaps the data ports " +
           std::to_string(c.data_port) + "-" + std::to_string(c.data_port + c.threads - 1) +
           " (TCP and UDP could share it, but that is almost always a mistake)";
  return "";
}

}  // namespace gradswitch
