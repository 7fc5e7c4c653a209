#!/usr/bin/env bash
# The main job on the bundled sample gradients: installs what is missing, builds gcz (Release), then
# measures a few codecs, encodes one file, shows and verifies it, and decodes it back.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash .ci/setup.sh gcz_cli
gcz="$root/build/gcz"
out="$root/build/samples"
mkdir -p "$out"
step="samples/grads/step_0000.safetensors"

for spec in fp16 bf16 bf16+zstd; do
  echo "== gcz eval $step -c $spec"
  "$gcz" eval "$step" -c "$spec"
  echo
done

echo "== gcz encode $step -o $out/step_0000.gcz -c bf16+zstd --rule '*.bias=none' --min-numel 256"
"$gcz" encode "$step" -o "$out/step_0000.gcz" -c bf16+zstd --rule '*.bias=none' --min-numel 256 \
  --meta source="$step"
echo
echo "== gcz info $out/step_0000.gcz"
"$gcz" info "$out/step_0000.gcz"
echo
echo "== gcz verify"
"$gcz" verify "$out/step_0000.gcz"
echo
echo "== gcz decode -> $out/step_0000.restored.safetensors"
"$gcz" decode "$out/step_0000.gcz" -o "$out/step_0000.restored.safetensors"
ls -l "$step" "$out/step_0000.gcz" "$out/step_0000.restored.safetensors"
