#!/usr/bin/env bash
# The main job on the bundled sample gradients: installs what is missing, builds gcz (Release), then
# measures every codec, encodes one file with a hybrid codec, shows and verifies it, decodes it back,
# and runs three training steps with and without error feedback.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash .ci/setup.sh gcz_cli
gcz="$root/build/gcz"
out="$root/build/samples"
mkdir -p "$out"
step="samples/grads/step_0000.safetensors"

echo "== gcz eval $step -c SPEC   (the TOTAL row of each report; run one for every tensor)"
printf '%-44s %8s %8s %10s %9s %10s\n' spec ratio bits/el rel_l2 cosine norm_ratio
for spec in fp16 bf16+zstd qsgd 'qsgd:bits=4' terngrad+zstd topk randomk powersgd \
            'topk:ratio=0.01,values=(qsgd:bits=8)+zstd' 'powersgd:rank=4,factors=(bf16)'; do
  "$gcz" eval "$step" -c "$spec" --csv 2>/dev/null | awk -F, -v spec="$spec" \
    '$1 == "TOTAL" { printf "%-44s %8.2f %8.2f %10.3e %9.5f %10.4f\n", spec, $8, $9, $10, $11, $14 }'
done
echo

spec='topk:ratio=0.05,values=(qsgd:bits=8)+zstd'
echo "== gcz encode $step -o $out/step_0000.gcz -c '$spec' --rule '*.bias=none' --min-numel 256"
"$gcz" encode "$step" -o "$out/step_0000.gcz" -c "$spec" --rule '*.bias=none' --min-numel 256 \
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
echo

for ef in "" "--ef"; do
  echo "== gcz eval --steps samples/grads/step_000{0,1,2}.safetensors -c topk $ef   (summary)"
  "$gcz" eval --steps samples/grads/step_0000.safetensors samples/grads/step_0001.safetensors \
    samples/grads/step_0002.safetensors -c topk $ef 2>/dev/null | sed -n '/^== summary/,$p'
  echo
done

levels=(--adapt fp16 --adapt 'qsgd:bits=4' --adapt 'topk:ratio=0.01')
echo "== gcz eval --steps samples/grads/step_000{0,1,2}.safetensors --adapt fp16 --adapt 'qsgd:bits=4'" \
  "--adapt 'topk:ratio=0.01' --budget 600KiB,40KiB,600KiB --ef   (summary: step 1 congested)"
"$gcz" eval --steps samples/grads/step_0000.safetensors samples/grads/step_0001.safetensors \
  samples/grads/step_0002.safetensors "${levels[@]}" --budget 600KiB,40KiB,600KiB --ef 2>/dev/null |
  sed -n '/^== summary/,$p'
