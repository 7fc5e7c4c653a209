#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (e.g. an H200): builds gcz with the CUDA
# backend for sm_90, runs the CPU/GPU parity tests (which skip without a device), and the cast codecs'
# throughput on both backends. Prints a short table; exits non-zero if a test fails or skips.
# Usage: tests/gpu/device_checks.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build-gpu}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGCZ_WITH_CUDA=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target gcz_tests gcz_cli >"$build/gpu-build.log" 2>&1 ||
  { tail -n 40 "$build/gpu-build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "== CPU/GPU parity tests"
"$build/tests/gcz_tests" --gtest_filter='Cuda*' --gtest_brief=1 | tail -n 5
skipped=$("$build/tests/gcz_tests" --gtest_filter='Cuda*' 2>&1 | grep -c '\[  SKIPPED \]' || true)
if [ "$skipped" -gt 0 ]; then echo "GPU tests skipped: no usable device"; exit 1; fi
echo "== throughput, 1 GiB synthetic float32 (GB/s of input; x memcpy = host memcpy)"
for device in cpu cuda; do
  "$build/gcz" bench --device "$device" --size-mib 1024 --repeat 5 --threads 1 -c fp16 -c bf16 | tail -n 3
done
