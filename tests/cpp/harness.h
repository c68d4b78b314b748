// A minimal test harness: TEST(name) { CHECK(...); } and a main that runs every test, or only
// those whose name contains $GS_TEST_ONLY (to repeat one intermittent test in a loop).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace gs_test {
struct Case {
  const char* name;
  std::function<void()> fn;
};
inline std::vector<Case>& registry() {
  static std::vector<Case> r;
  return r;
}
inline int& failures() {
  static int f = 0;
  return f;
}
struct Register {
  Register(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};
}  // namespace gs_test

#define GS_CAT2(a, b) a##b
#define GS_CAT(a, b) GS_CAT2(a, b)
#define TEST(name)                                          \
  static void name();                                       \
  static gs_test::Register GS_CAT(reg_, name)(#name, name); \
  static void name()

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++gs_test::failures();                                                          \
    }                                                                                 \
  } while (0)

#define CHECK_EQ(a, b)                                                                                    \
  do {                                                                                                    \
    auto _va = (a);                                                                                       \
    auto _vb = (b);                                                                                       \
    if (!(_va == _vb)) {                                                                                  \
      std::fprintf(stderr, "  %s:%d: CHECK_EQ failed: %s == %s (%s vs %s)\n", __FILE__, __LINE__, #a, #b, \
                   std::to_string(_va).c_str(), std::to_string(_vb).c_str());                             \
      ++gs_test::failures();                                                                              \
    }                                                                                                     \
  } while (0)

#define GS_TEST_MAIN()                                        \
  int main() {                                                \
    int passed = 0, failed = 0;                               \
    const char* only = std::getenv("GS_TEST_ONLY");           \
    for (auto& c : gs_test::registry()) {                     \
      if (only && !std::strstr(c.name, only)) continue;       \
      int before = gs_test::failures();                       \
      c.fn();                                                 \
      bool ok = gs_test::failures() == before;                \
      std::printf("[%s] %s\n", ok ? "PASS" : "FAIL", c.name); \
      (ok ? passed : failed)++;                               \
    }                                                         \
    std::printf("%d passed, %d failed\n", passed, failed);    \
    return failed ? 1 : 0;                                    \
  }
