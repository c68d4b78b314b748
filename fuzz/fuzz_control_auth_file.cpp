// libFuzzer target over the auth file's parser (src/switch/control/auth.h): any text gives a
// table or an error naming a line, never a crash; every parsed entry obeys the grammar (valid
// names and secrets, quotas within the switch's limits, names unique).
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "switch/control/auth.h"

using namespace gradswitch::control;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Quota limits{64, uint64_t{1} << 30};
  std::string error;
  auto table = parse_auth_file(std::string_view(reinterpret_cast<const char*>(data), size), limits, &error);
  if (!table) {
    if (error.empty()) __builtin_trap();
    return 0;
  }
  std::set<std::string> names;
  for (const Tenant& t : table->tenants) {
    if (!is_valid_tenant_name(t.name) || !is_valid_secret(t.secret) || !names.insert(t.name).second)
      __builtin_trap();
    if (t.quota.max_jobs > limits.max_jobs || t.quota.max_memory > limits.max_memory) __builtin_trap();
    if (table->find(t.name) < 0) __builtin_trap();
  }
  if (table->anonymous &&
      (table->anonymous->max_jobs > limits.max_jobs || table->anonymous->max_memory > limits.max_memory))
    __builtin_trap();
  return 0;
}
