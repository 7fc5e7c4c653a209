#!/usr/bin/env bash
# Shared set-up for samples/run.sh and tests/run.sh: installs what is missing (Debian packages, Python
# packages), then configures (Release) and builds gcz incrementally in build/.
# Usage: .ci/setup.sh [make targets...]   (default: all)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

debs=(cmake g++ pkg-config libcli11-dev libzstd-dev libxxhash-dev nlohmann-json3-dev libhdf5-dev
      zlib1g-dev libminizip-dev libdeflate-dev libgtest-dev libopenblas-dev python3)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi

py=(numpy pytest zstandard xxhash)
need=()
for m in "${py[@]}"; do python3 -c "import $m" 2>/dev/null || need+=("$m"); done
if ((${#need[@]})); then
  echo "setup: pip install ${need[*]}" >&2
  python3 -m pip install -q --disable-pip-version-check "${need[@]}"
fi

if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${GCZ_CMAKE_ARGS:-} >/dev/null
fi
jobs="$(nproc 2>/dev/null || echo 2)"
if ! cmake --build build -j "$jobs" ${1:+--target "$@"} >build/build.log 2>&1; then
  grep -E -A5 'error|Error' build/build.log | head -n 80 >&2
  echo "setup: build failed; full log in build/build.log" >&2
  exit 1
fi
