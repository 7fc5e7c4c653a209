#!/usr/bin/env bash
# Runs every gcz test (C++ unit tests through CTest, then the Python tests: numpy reader, CLI
# end-to-end) after installing what is missing and building. Exits non-zero on any failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash .ci/setup.sh
echo "== C++ tests (ctest)"
if ! ctest --test-dir build --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" >build/ctest.log 2>&1; then
  grep -v -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' build/ctest.log | tail -n 200
  exit 1
fi
grep -E 'tests passed|tests failed|Total Test time' build/ctest.log
echo "$(grep -cE 'Test +#[0-9]+: .*Skipped' build/ctest.log) skipped (GPU tests without a usable CUDA device; the reasons are in build/ctest.log)"
echo "== Python tests (pytest)"
GCZ_BIN="$root/build/gcz" python3 -m pytest -q tests/python
