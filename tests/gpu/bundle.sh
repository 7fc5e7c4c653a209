#!/usr/bin/env bash
# Packs a CUDA build of gcz for a GPU machine that cannot build it (no HDF5, zstd, ... headers there):
# the CLI, the unit-test binary and every shared library they load but the C library's own, in one
# tarball that `tests/gpu/device_checks.sh --prebuilt TARBALL` unpacks and runs. The binaries need a
# C library at least as new as this machine's on the GPU machine (x86-64 Linux).
# Usage: tests/gpu/bundle.sh [build-dir] [tarball]   (defaults: build, .gpu-bundle/gcz-gpu.tar.xz)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
tarball="${2:-$root/.gpu-bundle/gcz-gpu.tar.xz}"

cmake --build "$build" -j "$(nproc)" --target gcz_cli gcz_tests >/dev/null
if ! "$build/gcz" --version | grep -q 'CUDA backend built in'; then
  echo "$build is not a CUDA build of gcz: configure it with -DGCZ_WITH_CUDA=ON" >&2
  exit 1
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gcz-gpu/bin" "$stage/gcz-gpu/lib"
cp "$build/gcz" "$build/tests/gcz_tests" "$stage/gcz-gpu/bin/"
# Every library ldd resolves, but the C library's parts and the loader, which the GPU machine has.
ldd "$build/gcz" "$build/tests/gcz_tests" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$soname" in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | ld-linux*) ;;
      *) cp -L "$path" "$stage/gcz-gpu/lib/$soname" ;;
    esac
  done
git -C "$root" describe --always --dirty >"$stage/gcz-gpu/COMMIT" 2>/dev/null || echo unknown >"$stage/gcz-gpu/COMMIT"
mkdir -p "$(dirname "$tarball")"
tar -C "$stage" -cJf "$tarball" gcz-gpu
echo "$tarball: $(du -h "$tarball" | cut -f1), $(ls "$stage/gcz-gpu/lib" | wc -l) libraries, commit $(cat "$stage/gcz-gpu/COMMIT")"
