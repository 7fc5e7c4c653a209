#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (e.g. an H200):
# - builds gcz with the CUDA backend for sm_90 (or unpacks a prebuilt bundle);
# - runs the CPU/GPU parity tests (which skip without a device);
# - checks end to end that `gcz encode` and `gcz decode` write the same bytes on both backends;
# - measures the cast codecs' throughput on both, and the GPU kernels against a device copy;
# - measures how the CPU codecs scale with threads on the machine's cores;
# - runs some parity tests under compute-sanitizer memcheck where it works.
# Exits non-zero if a test fails or skips, a step fails or runs past its time, or the bytes differ.
# Full logs go to $OUT (where set) or to the build directory.
# Usage: tests/gpu/device_checks.sh [build-dir]
#        tests/gpu/device_checks.sh --prebuilt TARBALL   (made by tests/gpu/bundle.sh on a machine that
#                                                         can build gcz: nothing is built here)
# Meant for one call of at most 10 minutes: each step has a timeout of its own, so that a step that
# hangs is cut short and says so, but a build from scratch plus everything else may need most of it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
prebuilt=""
if [ "${1:-}" = "--prebuilt" ]; then
  prebuilt="${2:?--prebuilt needs the tarball tests/gpu/bundle.sh made}"
  build="$(mktemp -d)"
else
  build="${1:-$root/build-gpu}"
fi
logs="${OUT:-$build}"
mkdir -p "$build" "$logs"

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"
echo "$(nproc) CPU cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"

if [ -n "$prebuilt" ]; then
  echo "== prebuilt binaries from $prebuilt"
  tar -C "$build" -xJf "$prebuilt"
  # For every command from here on: the bundle's libraries come first (the device's tools ran with
  # them on an H200).
  export LD_LIBRARY_PATH="$build/gcz-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  mkdir -p "$build/tests"
  ln -s "$build/gcz-gpu/bin/gcz" "$build/gcz"
  ln -s "$build/gcz-gpu/bin/gcz_tests" "$build/tests/gcz_tests"
  echo "commit $(cat "$build/gcz-gpu/COMMIT"); $("$build/gcz" --version)"
else
  # A bare machine may lack the libraries gcz builds against: say which before CMake fails on one.
  missing=""
  for header in hdf5.h zstd.h xxhash.h nlohmann/json.hpp CLI/CLI.hpp minizip/unzip.h gtest/gtest.h cblas.h; do
    found=$(find /usr/include /usr/local/include -path "*/$header" -print -quit 2>/dev/null || true)
    [ -n "$found" ] || missing="$missing $header"
  done
  if [ -n "$missing" ]; then
    echo "cannot build here: no${missing} (Debian: libhdf5-dev libzstd-dev libxxhash-dev nlohmann-json3-dev"
    echo "libcli11-dev libminizip-dev libgtest-dev libopenblas-dev); build elsewhere and use --prebuilt"
    exit 1
  fi

  echo "== build (sm_90 + PTX)"
  timeout 120 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGCZ_WITH_CUDA=ON >"$logs/gpu-configure.log" 2>&1 ||
    { tail -n 40 "$logs/gpu-configure.log"; exit 1; }
  timeout 360 cmake --build "$build" -j "$(nproc)" --target gcz_tests gcz_cli >"$logs/gpu-build.log" 2>&1 ||
    { tail -n 40 "$logs/gpu-build.log"; exit 1; }
fi

echo "== CPU/GPU parity tests"
status=0
timeout 120 "$build/tests/gcz_tests" --gtest_filter='Cuda*' >"$logs/gpu-tests.log" 2>&1 || status=$?
grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$logs/gpu-tests.log" || true
grep -E '^\[  FAILED  \] [A-Za-z]|differs|Failure|no CUDA device' "$logs/gpu-tests.log" | sort -u | head -n 20 || true
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
  timeout 90 "$build/gcz" bench --device "$device" --size-mib 1024 --repeat 5 --threads 1 -c fp16 -c bf16 \
    >"$logs/gpu-bench-$device.log" 2>&1 ||
    { echo "bench --device $device failed or ran past 90 s (exit $?)"; tail -n 5 "$logs/gpu-bench-$device.log"; exit 1; }
  echo "-- --device $device"
  sed -n '/^GPU, data/,/^The rows below/p' "$logs/gpu-bench-$device.log"  # the GPU's own rates, if any
  tail -n 3 "$logs/gpu-bench-$device.log"
done

echo "== CPU codecs on this machine's cores, 1 GiB synthetic float32 (scaling = over 1 thread)"
threads="1,2,4"
[ "$(nproc)" -ge 8 ] && threads="$threads,8"
[ "$(nproc)" -ge 16 ] && threads="$threads,16"
timeout 240 "$build/gcz" bench --device cpu --size-mib 1024 --repeat 3 --threads "$threads" \
  -c terngrad -c qsgd -c 'topk:ratio=0.01' >"$logs/cpu-scaling.log" 2>&1 ||
  { echo "the CPU bench failed or ran past 240 s (exit $?)"; tail -n 5 "$logs/cpu-scaling.log"; exit 1; }
sed -n '/^yardstick/,$p' "$logs/cpu-scaling.log"

echo "== compute-sanitizer memcheck of some parity tests"
PATH="$PATH:/usr/local/cuda/bin"
if command -v compute-sanitizer >/dev/null; then
  status=0
  # All four tests of one source dtype per pair of element sizes the kernel handles (2 -> 4, 4 -> 2,
  # 2 -> 2, 8 -> 2 and 8 -> 4 bytes), and the backend's own tests.
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$build/tests/gcz_tests" --gtest_filter='CudaBackend.*:Cuda/CudaCast.*/float16_fp32:Cuda/CudaCast.*/float32_bf16:'\
'Cuda/CudaCast.*/float16_bf16:Cuda/CudaCast.*/float64_fp16:Cuda/CudaCast.*/float64_fp32' \
    >"$logs/gpu-memcheck.log" 2>&1 || status=$?
  grep -E 'ERROR SUMMARY|^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]' "$logs/gpu-memcheck.log" | tail -n 4 || true
  if [ "$status" -eq 0 ] && grep -q '^\[  SKIPPED \]' "$logs/gpu-memcheck.log"; then
    echo "memcheck checked nothing: the GPU tests skipped under it ($logs/gpu-memcheck.log)"; exit 1
  fi
  if [ "$status" -eq 0 ] && ! grep -q '^\[  PASSED  \] 22 tests' "$logs/gpu-memcheck.log"; then
    echo "memcheck: expected 22 tests to pass under it ($logs/gpu-memcheck.log)"; exit 1
  fi
  case "$status" in
    0) echo "memcheck: clean" ;;
    9) echo "memcheck found errors: $logs/gpu-memcheck.log"; exit 1 ;;
    1) echo "parity tests failed under memcheck: $logs/gpu-memcheck.log"; exit 1 ;;
    124) echo "memcheck: cut short after 200 s, inconclusive"; exit 1 ;;
    *)
      # Seen on some virtual machines: the sanitizer refuses the device. Anything else is a failure.
      if grep -q 'Device not supported' "$logs/gpu-memcheck.log"; then
        echo "memcheck could not run here: compute-sanitizer does not support this device"
      else
        echo "memcheck ended with exit $status: $logs/gpu-memcheck.log"; tail -n 5 "$logs/gpu-memcheck.log"; exit 1
      fi
      ;;
  esac
else
  echo "compute-sanitizer: not on this machine"
fi
