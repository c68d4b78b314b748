// The option table: every option of gradswitchd once (name, argument, help, how to parse and print
// it, its group), in --help order. command_line.cpp and config_file.cpp read it; --help is built
// from it; applied to SwitchConfig{}, `get` gives each default.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "switch/config.h"

namespace gradswitch {

// One command-line option. `set` parses the argument into the config or returns false with a
// message; `get` prints the current value (applied to SwitchConfig{} it gives the default).
struct OptionSpec {
  const char* name;     // long option name without "--"
  const char* metavar;  // shown in --help; nullptr for a flag (no argument; `set` gets "")
  const char* help;
  std::function<bool(SwitchConfig&, const std::string&, std::string*)> set;
  std::function<std::string(const SwitchConfig&)> get;
  const char* group = "";  // "" = the daemon's, "dpdk" = the DPDK backend's
};

// Every option of gradswitchd, the DPDK backend's (group "dpdk") last: they are accepted before the
// `--` that starts the EAL arguments and after a second `--` that ends them.
const std::vector<OptionSpec>& switch_options();

// The option called `name` (without "--"), or nullptr.
const OptionSpec* find_option(const std::string& name);

}  // namespace gradswitch
