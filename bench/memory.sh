#!/usr/bin/env bash
# Peak memory of each policy (issue 19, item 10): runs the real `longwave run` once per policy (one worker,
# a few inner steps, a checkpoint and an evaluation every round) and prints its peak RSS (`/usr/bin/time -v`,
# "Maximum resident set size") divided by the model-sized state every DiLoCo run needs:
#   baseline = 6 fp32 copies of the parameters: model, gradient, AdamW exp_avg and exp_avg_sq, outer θ_global
#              and outer momentum (the parameter count comes from `longwave run --dry-run`).
# The fixed overhead (libtorch, the corpus, the actor system) is measured in the same run, as the peak RSS
# of the same command with the tiny preset, and printed with a second ratio that leaves it out.
#   bench/memory.sh [--preset 150m] [--runs "single ddp sync delayed eager streaming"] [--rounds 3]
#                   [--inner-steps 4] [--batch 1] [--seq-len 64] [--eval-batches 1] [--keep]
# A run is a policy (single and ddp are run.mode, the others diloco.outer) with optional overrides joined by
# '+', e.g. "sync+checkpoint.every_rounds=0+eval.async=false". Needs build/release/longwave (LONGWAVE=...).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${LONGWAVE:-build/release/longwave}
preset=150m
runs="single ddp sync delayed eager streaming"
rounds=3
inner=4
batch=1
seq_len=64
eval_batches=1
keep=0
die() { echo "memory: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=${2:?}; shift 2 ;;
    --runs) runs=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --inner-steps) inner=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --seq-len) seq_len=${2:?}; shift 2 ;;
    --eval-batches) eval_batches=${2:?}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
for v in "$rounds" "$inner" "$batch" "$seq_len" "$eval_batches"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || die "counts must be positive integers (got '$v')"
done
[ -x "$B" ] || die "$B not found: cmake --build --preset release --target longwave"
[ -x /usr/bin/time ] || die "/usr/bin/time not found (apt-get install time)"
work=$(mktemp -d /tmp/longwave-memory.XXXXXX)
if [ "$keep" = 1 ]; then echo "work directory: $work"; else trap 'rm -rf "$work"' EXIT; fi

# Streaming: 2 fragments, each all-reduce overlapping tau = 1 inner step (H must be a multiple of 2).
common=(--fresh --set train.workers=1 --set train.batch_size="$batch" --set model.seq_len="$seq_len"
        --set train.inner_steps="$inner" --set train.rounds="$rounds" --set train.warmup_steps=1
        --set eval.every_rounds=1 --set eval.batches="$eval_batches" --set checkpoint.every_rounds=1
        --set checkpoint.keep=1 --set metrics.enabled=false --set train.threads=2
        --set diloco.fragments=2 --set diloco.tau=1
        --set outer.lr=0.7 --set outer.momentum=0.9 --set outer.nesterov=true)

# policy_args POLICY: the --set arguments that select it.
policy_args() {
  case "$1" in
    single | ddp) echo "--set run.mode=$1" ;;
    sync | delayed | eager | streaming) echo "--set run.mode=diloco --set diloco.outer=$1" ;;
    *) die "unknown policy '$1' (single, ddp, sync, delayed, eager, streaming)" ;;
  esac
}

# peak_kib NAME ARGS...: runs longwave with ARGS under /usr/bin/time, prints its peak RSS in KiB.
peak_kib() {
  local name=$1; shift
  /usr/bin/time -v -o "$work/$name.time" "$B" run examples/local_diloco.toml "${common[@]}" \
    --set run.out_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "memory: run $name failed:" >&2; tail -5 "$work/$name.log" >&2; exit 1; }
  sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$work/$name.time"
}
wall_s() { sed -n 's/.*Elapsed (wall clock) time.*: \(.*\)/\1/p' "$work/$1.time"; }

n=$("$B" run examples/local_diloco.toml "${common[@]}" --set model.preset="$preset" \
  --set run.out_dir="$work/dry" --dry-run | sed -n 's/^# parameters: \([0-9]*\).*/\1/p')
[ -n "$n" ] || die "could not read the parameter count from --dry-run"
base_kib=$((6 * 4 * n / 1024))
echo "settings: preset $preset ($n parameters), 1 worker, fp32, batch $batch x $seq_len, H=$inner, $rounds rounds,"
echo "  a checkpoint (keep 1) and an evaluation ($eval_batches batch) every round, 2 torch threads, outer Nesterov"
echo "  lr 0.7 momentum 0.9 (the defaults); streaming: 2 fragments, tau 1"
echo "baseline = 6 x 4 B x $n = $((base_kib / 1024)) MiB (model, gradient, exp_avg, exp_avg_sq, θ_global, momentum)"
# shellcheck disable=SC2046
fixed_kib=$(peak_kib fixed $(policy_args sync) --set model.preset=tiny)
printf "fixed overhead: %d MiB (peak RSS of the sync run with the tiny preset: libtorch, corpus, actors)\n" \
  $((fixed_kib / 1024))
echo
printf "%-48s %10s %8s %12s %8s\n" run peak_MiB ratio "(peak-fixed)" wall
for r in $runs; do
  IFS=+ read -r -a parts <<<"$r"
  args=()
  # shellcheck disable=SC2207
  args+=($(policy_args "${parts[0]}"))
  for o in "${parts[@]:1}"; do args+=(--set "$o"); done
  name=$(echo "$r" | tr -c 'A-Za-z0-9_.\n-' '_')
  kib=$(peak_kib "$name" "${args[@]}" --set model.preset="$preset")
  awk -v r="$r" -v k="$kib" -v b="$base_kib" -v f="$fixed_kib" -v w="$(wall_s "$name")" \
    'BEGIN { printf "%-48s %10.0f %8.3f %12.3f %8s\n", r, k / 1024, k / b, (k - f) / b, w }'
done
echo
echo "ratio = peak RSS ÷ baseline; (peak-fixed) = (peak RSS − fixed overhead) ÷ baseline. Goal for sync: ratio ≤ 1.3."
