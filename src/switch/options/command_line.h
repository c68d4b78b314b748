// gradswitchd's command line, read with the option table (option_table.h): `--name value`,
// `--name=value`, flags, -h/--help, -V/--version, and `--` before the backend's own arguments
// (DPDK's EAL arguments), and `--config FILE` (config_file.h: the same options from a TOML file,
// read first, so that the command line's flags override it). --help is generated from the same table.
#pragma once

#include <string>
#include <vector>

#include "switch/config.h"

namespace gradswitch {

struct CommandLine {
  SwitchConfig config;
  bool help = false, version = false;
  std::vector<std::string> eal_args;  // --backend dpdk: between the first `--` and an optional second one
  std::string config_file;            // --config FILE: applied before the command line's options
};

// Parses argv[1..] into `out` (on top of what out->config already holds; with --config, on top of
// the file's options) and checks the result (validate_config). DPDK options may also follow the EAL arguments
// after a second `--`. False with `error` saying what is wrong.
bool parse_command_line(const std::vector<std::string>& args, CommandLine* out, std::string* error);

// Parses `--name value` options of the table (group `only_group` when not null) until the end
// of `args` or a `--`; anything else is an error. Returns the index after what it consumed (after
// the `--`). Used for the DPDK options that follow the EAL arguments, and by tools.
bool parse_options(const std::vector<std::string>& args, size_t begin, const char* only_group,
                   CommandLine* out, size_t* end, std::string* error);

// The --help text: every option of the table with its default, grouped, then `extra` (the DPDK
// backend's EAL and layout notes when it is built).
std::string help_text(const std::string& program, const std::string& extra);

}  // namespace gradswitch
