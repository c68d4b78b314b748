// Task placement on lcores (lcore_layout.h).
#include "switch/io/dpdk/lcore_layout.h"

namespace gradswitch::dpdk {

bool plan_lcores(const std::string& layout, unsigned lcores, unsigned ports, unsigned threads,
                 std::vector<LcoreTasks>* plan, std::string* chosen, std::string* error) {
  const unsigned L = lcores, P = ports, X = threads;
  std::string l = layout;
  if (l == "auto") l = L >= 2 * P + X ? "8b" : L >= P + X ? "8a" : L >= 2 ? "io" : "single";
  const unsigned need = l == "8b" ? 2 * P + X : l == "8a" ? P + X : l == "io" ? 2 : 1;
  if (l != "8b" && l != "8a" && l != "io" && l != "single") {
    *error = "unknown layout '" + layout + "' (expected auto, 8b, 8a, io or single)";
    return false;
  }
  if (L < need) {
    *error = "layout " + l + " needs " + std::to_string(need) + " lcores, EAL has " + std::to_string(L) +
             " (EAL -l)";
    return false;
  }
  std::vector<LcoreTasks> all(L);
  for (unsigned i = 0; i < L; ++i) all[i].lcore_index = i;
  unsigned next = 0;
  if (l == "8b") {
    for (unsigned p = 0; p < P; ++p) all[next++].rx_ports.push_back(p);
    for (unsigned p = 0; p < P; ++p) all[next++].tx_ports.push_back(p);
    for (unsigned k = 0; k < X; ++k) all[next++].aggs.push_back(k);
  } else if (l == "8a") {
    for (unsigned p = 0; p < P; ++p, ++next) all[next].rx_ports.push_back(p), all[next].tx_ports.push_back(p);
    for (unsigned k = 0; k < X; ++k) all[next++].aggs.push_back(k);
  } else {
    for (unsigned p = 0; p < P; ++p) all[0].rx_ports.push_back(p), all[0].tx_ports.push_back(p);
    for (unsigned k = 0; k < X; ++k) all[l == "io" ? 1 + k % (L - 1) : 0].aggs.push_back(k);
  }
  plan->clear();
  for (unsigned i = 0; i < L; ++i)
    if (i == 0 || !all[i].rx_ports.empty() || !all[i].tx_ports.empty() || !all[i].aggs.empty())
      plan->push_back(all[i]);
  *chosen = l;
  return true;
}

}  // namespace gradswitch::dpdk
