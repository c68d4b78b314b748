// Checks of a whole configuration, for what involves several options (an address others can
// reach needs --auth-file; DPDK options need --backend dpdk; ports must not overlap).
#pragma once

#include <string>

#include "switch/config.h"

namespace gradswitch {

// "" when the config is usable, else what is wrong and how to fix it.
std::string validate_config(const SwitchConfig& c);

}  // namespace gradswitch
