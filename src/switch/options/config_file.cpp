// gradswitchd's TOML config file (config_file.h): walks the option table (option_table.h), so an option added
// to the table is a key of the file without an edit here.
#include "switch/options/config_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>

#include "switch/options/option_table.h"

namespace gradswitch {
namespace {

// Bigger than any sensible config; bounds what a mistaken path (a log, a device) makes us read.
constexpr size_t kMaxConfigBytes = 1 << 20;

std::string at(const std::string& source, const toml::source_region& r) {
  if (r.begin.line == 0) return source;
  return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

const char* type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    default:
      return "a date or time";
  }
}

// The option's argument as the command line spells it. A value option takes a string, an integer
// or a float (each checked by the option's parser, as the command line's text is); a flag takes a
// boolean (true = the flag given, false = not given). Empty optional when the TOML type cannot be
// the option's.
std::optional<std::string> argument_of(const OptionSpec& o, const toml::node& v, std::string* why) {
  if (!o.metavar) {
    if (const auto* b = v.as_boolean()) return b->get() ? std::optional<std::string>("") : std::nullopt;
    *why = std::string("expected true or false, got ") + type_name(v.type());
    return std::nullopt;
  }
  if (const auto* s = v.as_string()) return s->get();
  if (const auto* i = v.as_integer()) return std::to_string(i->get());
  if (const auto* f = v.as_floating_point()) {
    char b[64];
    const auto r = std::to_chars(b, b + sizeof b, f->get());
    return std::string(b, r.ptr);
  }
  *why = std::string("expected a string or a number (") + o.metavar + "), got " + type_name(v.type());
  return std::nullopt;
}

bool apply_table(const toml::table& table, const std::string& group, const std::set<std::string>& groups,
                 const std::string& source, SwitchConfig* config, std::string* error) {
  const std::string in = group.empty() ? "" : " in [" + group + "]";
  for (auto&& [key, node] : table) {
    const std::string name(key.str());
    if (group.empty() && groups.count(name)) {
      if (const toml::table* sub = node.as_table()) {
        if (!apply_table(*sub, name, groups, source, config, error)) return false;
        continue;
      }
      *error = at(source, key.source()) + ": key '" + name + "': expected the table [" + name + "], got " +
               type_name(node.type());
      return false;
    }
    const OptionSpec* o = find_option(name);
    if (!o || o->group != group) {
      std::string hint;
      if (o && *o->group) hint = std::string(" (an option of the [") + o->group + "] table)";
      if (o && !*o->group) hint = " (a top-level option: put it before the first table)";
      if (!o && node.is_table()) hint = " (no such table)";
      *error = at(source, key.source()) + ": unknown key '" + name + "'" + in + hint;
      return false;
    }
    std::string why;
    const std::optional<std::string> arg = argument_of(*o, node, &why);
    if (!arg && !why.empty()) {
      *error = at(source, node.source()) + ": key '" + name + "'" + in + ": " + why;
      return false;
    }
    if (arg && !o->set(*config, *arg, &why)) {
      *error = at(source, node.source()) + ": key '" + name + "'" + in + ": " + why;
      return false;
    }
  }
  return true;
}

}  // namespace

bool apply_config_text(const std::string& text, const std::string& source, SwitchConfig* config,
                       std::string* error) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    *error = at(source, e.source()) + ": syntax error: " + std::string(e.description());
    return false;
  }
  std::set<std::string> groups;
  for (const OptionSpec& o : switch_options())
    if (*o.group) groups.insert(o.group);
  return apply_table(table, "", groups, source, config, error);
}

bool load_config_file(const std::string& path, SwitchConfig* config, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot read the config file " + path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    *error = "cannot read the config file " + path + ": not a regular file";
    return false;
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      *error = "cannot read the config file " + path + ": " + std::strerror(e);
      return false;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxConfigBytes) {
      ::close(fd);
      *error = "cannot read the config file " + path + ": larger than " + std::to_string(kMaxConfigBytes) +
               " bytes";
      return false;
    }
  }
  ::close(fd);
  return apply_config_text(text, path, config, error);
}

}  // namespace gradswitch
