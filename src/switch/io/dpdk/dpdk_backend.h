// The DPDK I/O backend: the aggregation switch as an L2 switch (docs/dpdk.md).
//
// Built only when pkg-config finds libdpdk (the daemon then defines GRADSWITCH_HAVE_DPDK=1).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "switch/io/backend.h"

namespace gradswitch {

class Engine;
struct SwitchConfig;

// `eal_args`: DPDK's EAL arguments (what followed `--` on the daemon's command line); the backend's
// own options are in config.dpdk. Initialises EAL and starts every port; on failure returns
// nullptr with `error` saying what to check. EAL can be initialised once per process, so this can
// succeed at most once. The returned backend's run() must be called from the thread that called
// this function (it becomes DPDK's main lcore). Jobs come from the control plane (or, in tools,
// are created on the engine directly).
std::unique_ptr<Backend> make_dpdk_backend(Engine& engine, const SwitchConfig& config,
                                           const std::vector<std::string>& eal_args, std::string* error);

// The part of --help about EAL arguments and lcore layouts (the options come from config.h).
std::string dpdk_backend_help();

}  // namespace gradswitch
