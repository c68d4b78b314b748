// The option table's builders: one OptionSpec from a SwitchConfig field and how its value is read
// (an unsigned range, a choice, checked text, a flag). Only option_table.cpp includes this.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "switch/options/option_table.h"
#include "switch/options/values.h"

namespace gradswitch::option_builders {

// A field of SwitchConfig, named by a member pointer (&SwitchConfig::mtu) or, inside a group, by a
// generic lambda returning it (`[](auto& c) -> auto& { return c.dpdk.mbufs; }`).
template <typename Field, typename Config>
decltype(auto) field_of(Field field, Config& c) {
  if constexpr (std::is_member_object_pointer_v<Field>)
    return (c.*field);
  else
    return field(c);
}

template <typename Field>
OptionSpec uint_option(const char* name, const char* metavar, const char* help, Field field, uint64_t lo,
                       uint64_t hi) {
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            uint64_t v;
            if (!option_values::parse_uint(s, lo, hi, &v, err)) return false;
            auto& f = field_of(field, c);
            f = static_cast<std::remove_reference_t<decltype(f)>>(v);
            return true;
          },
          [=](const SwitchConfig& c) { return std::to_string(field_of(field, c)); }};
}

template <typename Field>
OptionSpec choice_option(const char* name, const char* metavar, const char* help, Field field,
                         std::initializer_list<const char*> choices) {
  std::vector<const char*> copy(choices);
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            for (const char* ch : copy)
              if (s == ch) return (field_of(field, c) = s), true;
            std::string list;
            for (const char* ch : copy) list += list.empty() ? ch : std::string("|") + ch;
            *err = "expected one of " + list + ", got '" + s + "'";
            return false;
          },
          [=](const SwitchConfig& c) { return field_of(field, c); }};
}

// A string checked by `valid` (which explains what it expected); "" is allowed when `optional`.
template <typename Field>
OptionSpec text_option(const char* name, const char* metavar, const char* help, Field field, bool optional,
                       bool (*valid)(const std::string&, std::string*)) {
  return {name, metavar, help,
          [=](SwitchConfig& c, const std::string& s, std::string* err) {
            if (!(optional && s.empty()) && valid && !valid(s, err)) return false;
            field_of(field, c) = s;
            return true;
          },
          [=](const SwitchConfig& c) {
            const std::string& v = field_of(field, c);
            return v.empty() ? std::string("none") : v;
          }};
}

// A flag without argument that sets a bool to `value`.
template <typename Field>
OptionSpec flag_option(const char* name, const char* help, Field field, bool value) {
  return {
      name, nullptr, help,
      [=](SwitchConfig& c, const std::string&, std::string*) { return (field_of(field, c) = value), true; },
      [=](const SwitchConfig& c) { return std::string(field_of(field, c) == value ? "set" : "not set"); }};
}

}  // namespace gradswitch::option_builders
