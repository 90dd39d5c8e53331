#!/usr/bin/env bash
# Outer-step policy sweep: final val loss of each diloco.outer policy divided by sync's, at the same settings,
# for each outer optimizer setting given, measured in one run on one machine (4 workers in one process; the
# ring is exercised by tests/process/policy_test.cpp and bench/overlap.sh).
# Usage: bench/policy_quality.sh [ROUNDS] [H] ["lr:mu[:hb]" ...]   (default 12 10 "0.5:0" "1.0:0" "0.7:0.9")
# mu may be negative; ":hb" makes it heavy-ball momentum (outer.nesterov = false).
# Extra settings: LW_SET="--set diloco.tau=2 ..." Needs build/release/longwave. Prints a table and a CSV.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${LONGWAVE:-build/release/longwave}
rounds=${1:-12}
h=${2:-10}
shift 2 || shift $# || true
outers=("$@")
[ ${#outers[@]} -gt 0 ] || outers=("0.5:0" "1.0:0" "0.7:0.9")
[[ $rounds =~ ^[1-9][0-9]*$ && $h =~ ^[1-9][0-9]*$ ]] ||
  { echo "policy_quality: ROUNDS and H must be positive integers (got '$rounds' '$h')" >&2; exit 2; }
for o in "${outers[@]}"; do
  IFS=: read -r lr mu hb <<<"$o"
  [[ $lr =~ ^[0-9]*\.?[0-9]+$ && $mu =~ ^-?[0-9]*\.?[0-9]+$ && ${hb:-hb} == hb ]] ||
    { echo "policy_quality: bad outer setting '$o' (want lr:mu or lr:mu:hb, e.g. 0.7:-0.5:hb)" >&2; exit 2; }
done
policies=${LW_POLICIES:-"sync delayed eager streaming"}
out=$(mktemp -d /tmp/longwave-policy.XXXXXX)
trap 'rm -rf "$out"' EXIT
csv=${LW_CSV:-bench/policy_quality.csv}
# The policy test's short run: tiny model, seq 64, batch 8, inner lr 4e-3 (train.lr's default, which the test
# keeps), one torch thread per worker.
common=(--fresh --set run.seed=11 --set model.seq_len=64 --set train.batch_size=8 --set train.lr=4e-3 --set train.warmup_steps=10
        --set train.threads=1 --set train.inner_steps="$h" --set train.rounds="$rounds" --set eval.every_rounds=0
        --set eval.batches=16 --set checkpoint.every_rounds=0 --set metrics.enabled=false)
# shellcheck disable=SC2206
extra=(${LW_SET:-})

val_loss() { sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p' "$1/result.json"; }

echo "settings: tiny model, KJV bytes, 4 workers, $rounds rounds x H=$h, seq 64, batch 8, seed 11 ${extra[*]}"
echo "outer_lr,outer_momentum,nesterov,policy,val_loss,vs_sync" >"$csv"
printf "%-8s %-9s %-10s %9s %8s\n" outer_lr mu policy val_loss "÷sync"
for o in "${outers[@]}"; do
  IFS=: read -r lr mu hb <<<"$o"
  nesterov=true
  [ "${hb:-}" != hb ] || nesterov=false
  base=""
  for p in $policies; do
    name="$p-$lr-$mu${hb:+-$hb}"
    "$B" run examples/local_diloco.toml "${common[@]}" "${extra[@]}" --set run.out_dir="$out/$name" \
      --set diloco.outer="$p" --set outer.lr="$lr" --set outer.momentum="$mu" --set outer.nesterov="$nesterov" >"$out/$name.log" 2>&1 ||
      { echo "run $name failed:"; tail -5 "$out/$name.log"; exit 1; }
    v=$(val_loss "$out/$name")
    [ -n "$base" ] || base=$v
    r=$(awk -v a="$v" -v b="$base" 'BEGIN { printf "%.4f", a / b }')
    printf "%-8s %-9s %-10s %9.4f %8s\n" "$lr" "$mu${hb:+ $hb}" "$p" "$v" "$r"
    echo "$lr,$mu,$nesterov,$p,$v,$r" >>"$csv"
  done
done
echo "csv: $csv"
