#!/usr/bin/env bash
# Runs every test: C++ unit and golden-packet tests (plain and under ASan+UBSan), a bounded fuzz
# run, lint, and the Python suite (end to end over UDP, testbed, DPDK, torch). Installs what it needs.
# Privileged tests skip when not root; GRADSWITCH_REQUIRE_{NETNS,DPDK}=1 make them fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${GRADSWITCH_BUILD_JOBS:-2}
fuzz_seconds=${GRADSWITCH_FUZZ_SECONDS:-30}

bash scripts/install-deps.sh

echo "==> C++ build and tests"
cmake -S . -B build/test -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADSWITCH_WERROR=ON >/dev/null
ninja -C build/test -j"$jobs"
ctest --test-dir build/test --output-on-failure

echo "==> C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGRADSWITCH_SANITIZE=ON -DGRADSWITCH_DPDK=OFF >/dev/null
ninja -C build/asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure

echo "==> fuzzing (libFuzzer, ${fuzz_seconds}s per target)"
CC=clang CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADSWITCH_FUZZ=ON \
  -DGRADSWITCH_BUILD_TESTS=OFF -DGRADSWITCH_DPDK=OFF -DGRADSWITCH_MPI=OFF \
  "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link,address,undefined" >/dev/null
ninja -C build/fuzz -j"$jobs"
for target in build/fuzz/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  corpus=build/fuzz/corpus-$name
  mkdir -p "$corpus"
  [ -f "fuzz/seeds_${name#fuzz_}.py" ] && python3 "fuzz/seeds_${name#fuzz_}.py" "$corpus"
  "$target" -max_total_time="$fuzz_seconds" -print_final_stats=1 "$corpus" 2>&1 | tail -n 3
done

echo "==> lint"
python3 -m ruff check python tests bench examples fuzz
git ls-files '*.c' '*.cpp' '*.h' | xargs clang-format --dry-run --Werror

echo "==> Python package and tests"
python3 -m pip install -q --disable-pip-version-check --no-build-isolation .
python3 -m pytest -ra tests/python "$@"
