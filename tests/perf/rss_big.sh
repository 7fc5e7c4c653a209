#!/usr/bin/env bash
# Peak memory of encoding and decoding a large safetensors dump (default 4 GiB of float32 in four
# tensors, one of them 2 GiB) with fp16. Prints the peak RSS of each command (GNU time) and the
# throughput. Needs ~10 GiB of free disk in $TMPDIR. Usage: tests/perf/rss_big.sh [GiB]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
gcz="${GCZ_BIN:-$root/build/gcz}"
gib="${1:-4}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/gcz_rss.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
[ -x /usr/bin/time ] || { echo "needs GNU time (apt-get install time)" >&2; exit 2; }

python3 - "$dir/big.safetensors" "$gib" <<'PY'
import json, struct, sys
import numpy as np
path, gib = sys.argv[1], int(sys.argv[2])
total = gib << 30
sizes = [total // 2, total // 4, total // 8, total - total // 2 - total // 4 - total // 8]
header, off = {}, 0
for i, b in enumerate(sizes):
    n = b // 4
    header[f"layer{i}.weight"] = {"dtype": "F32", "shape": [n // 1024, 1024], "data_offsets": [off, off + n * 4]}
    off += n * 4
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
rng = np.random.default_rng(0)
block = (rng.standard_normal(1 << 24).astype(np.float32) * 1e-3)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for name, t in header.items():
        left = t["data_offsets"][1] - t["data_offsets"][0]
        while left:
            chunk = block[: min(left, block.nbytes) // 4]
            f.write(chunk.tobytes())
            left -= chunk.nbytes
PY
ls -l "$dir/big.safetensors"
run() {
  local label="$1"; shift
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$dir/rss" "$@" >/dev/null
  t1=$(date +%s.%N)
  printf '%-8s peak RSS %6.0f MiB, %.1f s, %.2f GB/s of input\n' "$label" "$(($(cat "$dir/rss") / 1024))" \
    "$(echo "$t1 - $t0" | bc)" "$(echo "($gib * 1073741824) / ($t1 - $t0) / 1000000000" | bc -l)"
}
run encode "$gcz" encode "$dir/big.safetensors" -o "$dir/big.gcz" -c fp16 -q
rm -f "$dir/big.safetensors"
run decode "$gcz" decode "$dir/big.gcz" -o "$dir/back.safetensors"
ls -l "$dir"
