#!/usr/bin/env bash
# The transport's rate limit (LONGWAVE_FAULT_RING_RATE, comm/fault_transport.hpp: GPU benches use it where
# network namespaces are not at hand) against tc tbf, in the same run: one fp32 ring of N ranks, once across
# network namespaces whose links tbf limits to RATE (bench/allreduce_wan.sh), once as local processes on
# loopback whose sends the decorator meters at RATE. Prints each busbw ÷ link and their ratio (goal: within
# 5 %). Needs root for the namespaces (exit 3 otherwise).
#   bench/rate_limit.sh [N=4] [RATE=25mbit] [bench_allreduce options...]
#   e.g. bench/rate_limit.sh 4 100mbit --n 4M --iters 3
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
rate=${2:-25mbit}
shift $(($# >= 2 ? 2 : $#))
bin=${LW_BENCH_ALLREDUCE:-build/release/bench/bench_allreduce}
[ -x "$bin" ] || { echo "rate_limit: $bin not built (cmake --build --preset release --target bench_allreduce)" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
gbit=$(lw_rate_gbit "$rate")
bytes_per_s=$(awk "BEGIN{printf \"%.0f\", $gbit * 1.25e8}")
opts=(--dtypes fp32 --no-baseline "$@")
case " $* " in *" --n "*) ;; *) opts+=(--n 1M) ;; esac  # 6 MiB per rank: 2 s at 25 Mbit/s
echo "rate_limit: $n ranks, fp32, link $rate ($bytes_per_s bytes/s); bench_allreduce ${opts[*]}"

echo "== tc tbf across network namespaces"
tbf_out=$(LW_BENCH_ALLREDUCE=$bin bench/allreduce_wan.sh "$n" "$rate" "${opts[@]}") || {
  rc=$?
  echo "$tbf_out"
  exit $rc
}
tbf=$(echo "$tbf_out" | awk '/^ring \(slowest/ { f = 1 } f && $1 == "fp32" { print $3 }')
echo "$tbf_out" | sed -n '/^ring (slowest/,$p'

echo "== the transport's rate limit on loopback (LONGWAVE_FAULT_RING_RATE=$bytes_per_s)"
dec_out=$(LONGWAVE_FAULT_RING_RATE=$bytes_per_s "$bin" --ranks "$n" --link-gbit "$gbit" "${opts[@]}") || {
  rc=$?
  echo "$dec_out"
  exit $rc
}
echo "$dec_out" | grep -E "^(dtype|fp32|       each)"
dec=$(echo "$dec_out" | awk '$1 == "fp32" && NF >= 6 { print $NF }')

if [ -z "$tbf" ] || [ -z "$dec" ]; then
  echo "rate_limit: a busbw figure is missing" >&2
  exit 1
fi
awk -v t="$tbf" -v d="$dec" -v r="$rate" 'BEGIN {
  ratio = d / t
  printf "busbw / link at %s: tc tbf %.3f, transport rate limit %.3f; limit / tbf = %.3f (%s 5 %%)\n", r, t, d,
    ratio, (ratio >= 0.95 && ratio <= 1.05) ? "within" : "NOT within"
}'
