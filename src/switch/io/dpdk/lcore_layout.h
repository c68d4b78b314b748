// Where the DPDK switch's tasks run (paper 000, Fig. 8 and 9): rx<p> (receive on port p, parse,
// switch or hand to aggregation), tx<p> (drain port p's TX ring) and agg<k> (aggregation thread k)
// placed on EAL's lcores by --layout. Pure arithmetic on counts; docs/dpdk.md has the table.
#pragma once

#include <string>
#include <vector>

namespace gradswitch::dpdk {

// The tasks of one lcore; index 0 is DPDK's main lcore.
struct LcoreTasks {
  unsigned lcore_index = 0;  // into EAL's lcore list (main first)
  std::vector<unsigned> rx_ports, tx_ports, aggs;
};

// Places the tasks for `ports` ports and `threads` aggregation threads on `lcores` lcores.
// `layout` is auto, 8b, 8a, io or single; `chosen` gets the layout used (auto resolves to the first
// of 8b, 8a, io, single that fits). Lcores without a task are left out, except the main lcore,
// which always runs (it also does the housekeeping). False with `error` when the layout needs more
// lcores than there are.
bool plan_lcores(const std::string& layout, unsigned lcores, unsigned ports, unsigned threads,
                 std::vector<LcoreTasks>* plan, std::string* chosen, std::string* error);

}  // namespace gradswitch::dpdk
