// The DPDK I/O backend: the aggregation switch as an L2 switch (issue 4, docs/dpdk.md).
//
// Built only when pkg-config finds libdpdk (the daemon then defines GRADSWITCH_HAVE_DPDK=1).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "switch/io/backend.h"

namespace gradswitch {

class Engine;
class ControlPlane;
struct SwitchConfig;

// `args`: what followed `--` on the daemon's command line: EAL arguments, then optionally `--` and
// this backend's own options (see dpdk_backend_help()). Initialises EAL and starts every port; on
// failure returns nullptr with `error` saying what to check. EAL can be initialised once per
// process, so this can succeed at most once. The returned backend's run() must be called from the
// thread that called this function (it becomes DPDK's main lcore).
std::unique_ptr<Backend> make_dpdk_backend(Engine& engine, ControlPlane& control, const SwitchConfig& config,
                                           const std::vector<std::string>& args, std::string* error);

// The same without a control plane (tools, benchmarks: jobs are created on the engine directly).
std::unique_ptr<Backend> make_dpdk_backend(Engine& engine, const SwitchConfig& config,
                                           const std::vector<std::string>& args, std::string* error);

// Text for `gradswitchd --backend dpdk --help`: the EAL arguments, the port and core layout and
// the backend's options.
std::string dpdk_backend_help();

}  // namespace gradswitch
