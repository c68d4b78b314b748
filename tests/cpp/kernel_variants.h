// The kernel variants this CPU runs, for tests that check each one (tests/cpp/test_kernels.cpp,
// test_mx8.cpp); a variant it cannot run is named on stdout, not compared.
#pragma once

#include <cstdio>
#include <vector>

#include "common/kernels.h"

inline std::vector<const gradswitch::Kernels*> variants() {
  std::vector<const gradswitch::Kernels*> v;
  for (const char* name : {"scalar", "avx2", "avx512"})
    if (const gradswitch::Kernels* k = gradswitch::kernels_named(name))
      v.push_back(k);
    else
      std::printf("  (variant %s not supported on this CPU: not compared)\n", name);
  return v;
}
