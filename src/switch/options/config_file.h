// gradswitchd's config file (`--config FILE`): the options of config.h's table by the same names,
// in TOML, read with toml++. The DPDK backend's options (group "dpdk") go in a [dpdk] table; every
// other option is a top-level key. Values are checked by the option's own parser, as on the command
// line; the command line's flags, applied after the file, override it (docs/deploy.md, "The config
// file").
#pragma once

#include <string>

#include "switch/config.h"

namespace gradswitch {

// Applies the options set in the TOML file at `path` to `config`. False with `error` naming the
// file and, where there is one, the line and column and the key ("FILE:LINE:COL: key 'threads': ..."):
// an unreadable file, a syntax error, an unknown key or table, or a value the option refuses.
bool load_config_file(const std::string& path, SwitchConfig* config, std::string* error);

// The same for TOML text already read (`source` names it in errors).
bool apply_config_text(const std::string& text, const std::string& source, SwitchConfig* config,
                       std::string* error);

}  // namespace gradswitch
