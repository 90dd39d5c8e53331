#!/usr/bin/env bash
# DiLoCo quality sweep: val perplexity of DiLoCo variants divided by a single worker's, at equal inner steps
# per worker, same seed and data, measured in one run. Usage: bench/diloco_quality.sh [STEPS] [extra --set ...]
# Needs build/release/longwave (scripts/demo builds it). Prints a table; record it in bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${LONGWAVE:-build/release/longwave}
steps=${1:-200}
shift || true
out=$(mktemp -d /tmp/longwave-quality.XXXXXX)
trap 'rm -rf "$out"' EXIT
common=(--fresh --set train.lr=4e-3 --set eval.every_rounds=0 --set eval.batches=16 --set checkpoint.every_rounds=0
        --set metrics.enabled=false --set train.warmup_steps=20 "$@")

ppl() { sed -n 's/.*"val_ppl": \([0-9.]*\).*/\1/p' "$1/result.json"; }

run() {  # name, H, then --set overrides
  local name=$1 h=$2; shift 2
  local rounds=$((steps / h))
  "$B" run examples/local_diloco.toml "${common[@]}" --set run.out_dir="$out/$name" \
    --set train.inner_steps="$h" --set train.rounds="$rounds" "$@" >"$out/$name.log" 2>&1 ||
    { echo "run $name failed:"; tail -5 "$out/$name.log"; exit 1; }
}

echo "settings: tiny model, KJV bytes, batch 8 x 128, $steps inner steps per worker, inner lr 4e-3 (cosine), extra: $*"
run single 50 --set run.mode=single --set train.workers=1
base=$(ppl "$out/single")
printf "%-34s %8s %8s\n" variant val_ppl "÷single"
printf "%-34s %8.3f %8.3f\n" "single worker" "$base" 1
variant() {  # label, name, H, overrides...
  local label=$1 name=$2; shift 2
  run "$name" "$@"
  local p
  p=$(ppl "$out/$name")
  printf "%-34s %8.3f %8.3f\n" "$label" "$p" "$(awk -v a="$p" -v b="$base" 'BEGIN { print a / b }')"
}
variant "ddp M=4 (4x batch)" ddp 50 --set run.mode=ddp
for h in 10 25 50; do
  variant "diloco M=4 H=$h lr 0.7 mu 0.9" "d_h$h" "$h" --set outer.lr=0.7 --set outer.momentum=0.9
done
variant "diloco M=4 H=25 lr 0.7 mu 0.5" d_mu05 25 --set outer.lr=0.7 --set outer.momentum=0.5
variant "diloco M=4 H=25 lr 1.0 mu 0.5" d_lr10_mu05 25 --set outer.lr=1.0 --set outer.momentum=0.5
variant "diloco M=4 H=25 lr 1.0 mu 0 (avg)" d_avg25 25 --set outer.lr=1.0 --set outer.momentum=0.0
variant "diloco M=4 H=10 lr 1.0 mu 0 (avg)" d_avg10 10 --set outer.lr=1.0 --set outer.momentum=0.0
variant "diloco M=4 H=50 lr 1.0 mu 0 (avg)" d_avg50 50 --set outer.lr=1.0 --set outer.momentum=0.0
