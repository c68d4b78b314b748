// gradswitchd's command line and --help from the option table (command_line.h).
#include "switch/options/command_line.h"

#include <cstring>

#include "switch/options/config_file.h"
#include "switch/options/option_table.h"
#include "switch/options/validate.h"

namespace gradswitch {
bool parse_options(const std::vector<std::string>& args, size_t begin, const char* only_group,
                   CommandLine* out, size_t* end, std::string* error) {
  size_t i = begin;
  int config_given = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (!only_group && (a == "-h" || a == "--help")) {
      out->help = true;
      continue;
    }
    if (!only_group && (a == "-V" || a == "--version")) {
      out->version = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      *error = a.rfind("-", 0) == 0 ? "unknown option '" + a + "'"
                                    : "unexpected argument '" + a + "' (EAL arguments go after --)";
      return false;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (!only_group && name == "config") {
      if (eq != std::string::npos) {
        out->config_file = a.substr(eq + 1);
      } else if (i + 1 < args.size()) {
        out->config_file = args[++i];
      } else {
        return *error = "option '--config' needs a value", false;
      }
      if (out->config_file.empty()) return *error = "option '--config' needs a file name", false;
      if (++config_given > 1) return *error = "option '--config' given twice", false;
      continue;
    }
    const OptionSpec* o = find_option(name);
    if (!o || (only_group && std::strcmp(o->group, only_group) != 0)) {
      *error = "unknown option '--" + name + "'" +
               (only_group ? std::string(" (after the EAL arguments only DPDK options are allowed)") : "");
      return false;
    }
    std::string value;
    if (!o->metavar) {
      if (eq != std::string::npos) return *error = "option '--" + name + "' takes no value", false;
    } else if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return *error = "option '--" + name + "' needs a value", false;
    }
    std::string why;
    if (!o->set(out->config, value, &why)) return *error = "bad value for --" + name + ": " + why, false;
  }
  *end = i;
  return true;
}

bool parse_command_line(const std::vector<std::string>& args, CommandLine* out, std::string* error) {
  size_t next = 0;
  // The file first, wherever --config stands, so that every flag overrides it: a first pass finds
  // --config (and any error of the command line itself), the second applies the flags on the file.
  CommandLine probe = *out;
  if (!parse_options(args, 0, nullptr, &probe, &next, error)) return false;
  if (!probe.config_file.empty() && !probe.help && !probe.version &&
      !load_config_file(probe.config_file, &out->config, error))
    return false;
  if (!parse_options(args, 0, nullptr, out, &next, error)) return false;
  if (next < args.size() && out->config.backend != "dpdk")
    return *error = "arguments after -- are for --backend dpdk (DPDK's EAL arguments)", false;
  for (; next < args.size() && args[next] != "--"; ++next) out->eal_args.push_back(args[next]);
  if (next < args.size() && !parse_options(args, next + 1, "dpdk", out, &next, error)) return false;
  if (next < args.size()) return *error = "unexpected '--' after the DPDK options", false;
  if (out->help || out->version) return true;
  if (std::string v = validate_config(out->config); !v.empty()) return *error = v, false;
  return true;
}

std::string help_text(const std::string& program, const std::string& extra) {
  const SwitchConfig defaults;
  std::string out = "usage: " + program +
                    " [options] [-- EAL-ARGS]\n"
                    "A software switch that sums data-parallel workers' gradients as they stream through.\n";
  std::string group = "-";
  for (const OptionSpec& o : switch_options()) {
    if (group != o.group) {
      group = o.group;
      out += group.empty() ? "\nOptions:\n"
                           : "\nDPDK backend options (--backend dpdk; also accepted after EAL-ARGS -- ):\n";
      if (group.empty())
        out +=
            "  --config FILE              read these options from a TOML file first (keys without --, the\n"
            "                             DPDK ones in a [dpdk] table); the command line overrides it\n";
    }
    const std::string flag = std::string("--") + o.name + (o.metavar ? std::string(" ") + o.metavar : "");
    char line[512];
    std::snprintf(line, sizeof line, "  %-26s %s (default %s)\n", flag.c_str(), o.help,
                  o.get(defaults).c_str());
    out += line;
  }
  out += "  -h, --help                 this text\n  -V, --version              print the version and exit\n";
  if (!extra.empty()) out += "\n" + extra;
  return out;
}

}  // namespace gradswitch
