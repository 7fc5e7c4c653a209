#!/usr/bin/env bash
# Installs the built gcz into a scratch prefix and builds tests/install/ against it with find_package.
set -euo pipefail
build="$1"; src="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/b" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/b" >/dev/null
"$work/b/c" "$src/../golden/fp16.gcz" | grep -q "^6 tensors$"
echo "installed package: ok"
