#!/usr/bin/env bash
# Ring all-reduce across network namespaces: one bench_allreduce rank per host of scripts/wan, each host's
# link limited by tc tbf. Prints every rank's table (busbw ÷ link rate, goodput ratios vs fp32); the slowest
# rank's times are the ring's. Unless --no-baseline is given, raw ZeroMQ streams in the ring's pattern (same
# bytes as an fp32 all-reduce, no reduction) are timed first in the same run: the ceiling of link and machine.
# Needs root (exit 3 otherwise). Tears the namespaces down on exit.
#   bench/allreduce_wan.sh [N=4] [RATE=1gbit] [bench_allreduce options...]
#   e.g. bench/allreduce_wan.sh 4 1gbit --n 16M --iters 3
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
rate=${2:-1gbit}
shift $(($# >= 2 ? 2 : $#))
bin=${LW_BENCH_ALLREDUCE:-build/release/bench/bench_allreduce}
[ -x "$bin" ] || { echo "allreduce_wan: $bin not built (cmake --build --preset release --target bench_allreduce)" >&2; exit 2; }
scripts/wan check || { echo "allreduce_wan: cannot create network namespaces here (needs root, ip, tc)" >&2; exit 3; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
gbit=$(lw_rate_gbit "$rate")
export LONGWAVE_WAN_PREFIX=lwbench
trap 'scripts/wan down lwbench' EXIT
scripts/wan up "$n" "$rate"
eps=""
for i in $(seq 0 $((n - 1))); do eps="$eps${eps:+,}tcp://$(scripts/wan addr "$i"):5700"; done
logs=$(mktemp -d)
pids=()
for i in $(seq 1 $((n - 1))); do
  scripts/wan exec "$i" "$bin" --endpoints "$eps" --rank "$i" --link-gbit "$gbit" "$@" >"$logs/rank$i.txt" 2>&1 &
  pids+=($!)
done
rc=0
scripts/wan exec 0 "$bin" --endpoints "$eps" --rank 0 --link-gbit "$gbit" "$@" | tee "$logs/rank0.txt" || rc=$?
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
for i in $(seq 1 $((n - 1))); do echo; cat "$logs/rank$i.txt"; done
# The ring's figures: per dtype, the slowest rank's time (sparse: the all-gather of sparse messages).
echo
echo "ring (slowest of the $n ranks per dtype; link $rate):"
cat "$logs"/rank*.txt | awk -v n="$n" -v gbit="$gbit" '
  $1 ~ /^(fp32|fp16|bf16|int8|sparse)$/ && $2 ~ /^[0-9.]+$/ && NF >= 7 { if ($2 > t[$1]) t[$1] = $2; mib[$1] = $3; seen[$1] = 1 }
  $1 == "stream" && $2 ~ /^[0-9.]+$/ { if ($2 > ts) ts = $2 }
  END {
    printf "%-6s %10s %12s %14s\n", "dtype", "time_ms", "busbw/link", "goodput/fp32";
    split("fp32 fp16 bf16 int8 sparse", order, " ");
    for (k = 1; k <= 5; ++k) { d = order[k]; if (!seen[d]) continue;
      # sparse: mib is one message, and an all-gather sends n - 1 of them.
      bus = (d == "sparse" ? n - 1 : 2 * (n - 1) / n) * mib[d] * 1048576 / (t[d] / 1000);
      printf "%-6s %10.1f %12.3f %13.3fx\n", d, t[d], bus / (gbit * 1.25e8), t["fp32"] / t[d] }
    if (seen["int8"] && seen["sparse"]) printf "sparse vs int8 time: %.2fx faster\n", t["int8"] / t["sparse"]
    if (ts > 0 && seen["fp32"]) {
      # The streams carry exactly the fp32 ring'"'"'s bytes, so the rate ratio is the inverse time ratio.
      stream = 2 * (n - 1) / n * mib["fp32"] * 1048576 / (ts / 1000);
      printf "raw ZeroMQ ring streams (same bytes, no reduction): %.1f ms, %.3f of the link\n", ts, stream / (gbit * 1.25e8);
      printf "fp32 ring busbw / raw streams: %.3f\n", ts / t["fp32"] }
  }'
rm -rf "$logs"
exit $rc
