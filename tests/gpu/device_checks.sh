#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (e.g. an H200): builds gcz with the CUDA
# backend for sm_90, runs the CPU/GPU parity tests (which skip without a device), checks end to end
# that `gcz encode` and `gcz decode` write the same bytes on both backends, and measures the cast
# codecs' throughput on both. Prints a short table; exits non-zero if a test fails or skips, or if
# the bytes differ. Full logs go to $OUT (where set) or to the build directory.
# Usage: tests/gpu/device_checks.sh [build-dir]
# Meant for one call of at most 10 minutes: each step has a timeout of its own, so that a step that
# hangs is cut short and says so, but a build from scratch plus everything else may need most of it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build-gpu}"
logs="${OUT:-$build}"
mkdir -p "$build" "$logs"

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"

# A bare machine may lack the libraries gcz builds against: say which before CMake fails on one.
missing=""
for header in hdf5.h zstd.h xxhash.h nlohmann/json.hpp CLI/CLI.hpp minizip/unzip.h gtest/gtest.h cblas.h; do
  found=$(find /usr/include /usr/local/include -path "*/$header" -print -quit 2>/dev/null || true)
  [ -n "$found" ] || missing="$missing $header"
done
if [ -n "$missing" ]; then
  echo "cannot build here: no${missing} (Debian: libhdf5-dev libzstd-dev libxxhash-dev nlohmann-json3-dev"
  echo "libcli11-dev libminizip-dev libgtest-dev libopenblas-dev)"
  exit 1
fi

echo "== build (sm_90 + PTX)"
timeout 120 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGCZ_WITH_CUDA=ON >"$logs/gpu-configure.log" 2>&1 ||
  { tail -n 40 "$logs/gpu-configure.log"; exit 1; }
timeout 360 cmake --build "$build" -j "$(nproc)" --target gcz_tests gcz_cli >"$logs/gpu-build.log" 2>&1 ||
  { tail -n 40 "$logs/gpu-build.log"; exit 1; }

echo "== CPU/GPU parity tests"
status=0
timeout 120 "$build/tests/gcz_tests" --gtest_filter='Cuda*' >"$logs/gpu-tests.log" 2>&1 || status=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/gpu-tests.log" | sort | uniq -c | sort -rn | head -n 20 || true
grep -E 'differs|Failure|no CUDA device' "$logs/gpu-tests.log" | head -n 20 || true
if [ "$status" -ne 0 ]; then echo "parity tests failed (exit $status): $logs/gpu-tests.log"; exit 1; fi
if grep -q '\[  SKIPPED \]' "$logs/gpu-tests.log"; then echo "GPU tests skipped: no usable device"; exit 1; fi

echo "== end to end: the same bytes from --device cpu and --device cuda"
work="$build/gpu-e2e"
rm -rf "$work" && mkdir -p "$work"
for codec in fp16 bf16 fp32; do
  for device in cpu cuda; do
    timeout 30 "$build/gcz" encode "$root/samples/grads/step_0000.safetensors" -o "$work/$codec.$device.gcz" \
      -c "$codec" --device "$device" -q
    timeout 30 "$build/gcz" decode "$work/$codec.$device.gcz" -o "$work/$codec.$device.safetensors" \
      --device "$device"
  done
  cmp "$work/$codec.cpu.gcz" "$work/$codec.cuda.gcz"
  cmp "$work/$codec.cpu.safetensors" "$work/$codec.cuda.safetensors"
  echo "$codec: encode and decode identical"
done

echo "== throughput, 1 GiB synthetic float32 (GB/s of input; x memcpy = host memcpy)"
for device in cpu cuda; do
  timeout 90 "$build/gcz" bench --device "$device" --size-mib 1024 --repeat 5 --threads 1 -c fp16 -c bf16 |
    tee "$logs/gpu-bench-$device.log" | tail -n 3
done
