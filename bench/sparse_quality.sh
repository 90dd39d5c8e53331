#!/usr/bin/env bash
# Sparse codec quality (issue 22): final val loss of fp32 and of the sparse codec at several densities and
# bits, each ÷ fp32's at the same outer setting, with the bytes each sends per value against fp32. A cluster
# of 4 one-worker nodes on this machine (examples/cluster_4nodes.toml, plain TCP on loopback): each node codes
# its own pseudo-gradient with its own error feedback (one process would be one node, coding the mean once).
# Usage: bench/sparse_quality.sh [ROUNDS] [H] ["lr:mu" ...]   (default 50 10 "0.7:0.9" "1.0:0")
# Grid: LW_GRID="density:bits ..." (default "0.01:2 0.01:4 0.03:2 0.03:4 0.1:2 0.1:4").
# Extra settings: LW_SET="--set comm.ef_decay=1 ..."; binary: LONGWAVE (default build/release/longwave, else
# build/ci/longwave). Prints a table and writes a CSV (LW_CSV, default bench/sparse_quality.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${LONGWAVE:-build/release/longwave}
[ -x "$B" ] || B=build/ci/longwave
[ -x "$B" ] || { echo "sparse_quality: no longwave binary (build first, or set LONGWAVE)" >&2; exit 2; }
rounds=${1:-50}
h=${2:-10}
shift 2 || shift $# || true
outers=("$@")
[ ${#outers[@]} -gt 0 ] || outers=("0.7:0.9" "1.0:0")
[[ $rounds =~ ^[1-9][0-9]*$ && $h =~ ^[1-9][0-9]*$ ]] ||
  { echo "sparse_quality: ROUNDS and H must be positive integers (got '$rounds' '$h')" >&2; exit 2; }
grid=${LW_GRID:-"0.01:2 0.01:4 0.03:2 0.03:4 0.1:2 0.1:4"}
out=$(mktemp -d /tmp/longwave-sparse.XXXXXX)
trap 'rm -rf "$out"' EXIT
csv=${LW_CSV:-bench/sparse_quality.csv}
common=(--fresh --set run.seed=11 --set model.seq_len=64 --set train.batch_size=8 --set train.lr=4e-3
        --set train.warmup_steps=10 --set train.threads=1 --set train.inner_steps="$h" --set train.rounds="$rounds"
        --set eval.every_rounds=0 --set eval.batches=16 --set checkpoint.every_rounds=0 --set metrics.enabled=false
        --set security.mode=none --set comm.dtype=fp32 --set comm.error_feedback=false)
# shellcheck disable=SC2206
extra=(${LW_SET:-})

val_loss() { sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p' "$1/a/result.json"; }  # every node has the same theta
# fp32 bytes ÷ sparse bytes for a chunk of 4096 values (comm/CODEC.md: 8 header bytes, 12-bit indices).
ratio() { awk -v d="$1" -v b="$2" 'BEGIN { k = int(d * 4096 + 0.5); if (k < 1) k = 1;
  printf "%.1f", 4 * 4096 / (8 + int((k * 12 + 7) / 8) + int((k * b + 7) / 8)) }'; }

echo "settings: tiny model, KJV bytes, 4 one-worker nodes, $rounds rounds x H=$h, seq 64, batch 8, seed 11 ${extra[*]}"
echo "outer_lr,outer_momentum,codec,density,value_bits,bytes_vs_fp32,val_loss,vs_fp32" >"$csv"
printf "%-8s %-6s %-8s %8s %5s %9s %9s %8s\n" outer_lr mu codec density bits "÷bytes" val_loss "÷fp32"
for o in "${outers[@]}"; do
  IFS=: read -r lr mu <<<"$o"
  run() {  # name, then --set overrides
    local name=$1; shift
    "$B" launch examples/cluster_4nodes.toml "${common[@]}" "${extra[@]}" --set run.out_dir="$out/$name" \
      --set outer.lr="$lr" --set outer.momentum="$mu" "$@" >"$out/$name.log" 2>&1 ||
      { echo "run $name failed:"; tail -5 "$out/$name.log"; exit 1; }
  }
  run "fp32-$lr-$mu"
  base=$(val_loss "$out/fp32-$lr-$mu")
  printf "%-8s %-6s %-8s %8s %5s %9s %9.4f %8s\n" "$lr" "$mu" fp32 1 32 1 "$base" 1
  echo "$lr,$mu,fp32,1,32,1,$base,1" >>"$csv"
  for g in $grid; do
    IFS=: read -r d b <<<"$g"
    name="sparse-$d-$b-$lr-$mu"
    run "$name" --set comm.dtype=sparse --set comm.density="$d" --set comm.value_bits="$b"
    v=$(val_loss "$out/$name")
    r=$(awk -v a="$v" -v b="$base" 'BEGIN { printf "%.4f", a / b }')
    printf "%-8s %-6s %-8s %8s %5s %9s %9.4f %8s\n" "$lr" "$mu" sparse "$d" "$b" "$(ratio "$d" "$b")" "$v" "$r"
    echo "$lr,$mu,sparse,$d,$b,$(ratio "$d" "$b"),$v,$r" >>"$csv"
  done
done
echo "csv: $csv"
