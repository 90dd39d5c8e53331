#!/usr/bin/env bash
# State transfer across network namespaces (scripts/wan): a joiner on host 0 downloads a state from PEERS
# serving processes on hosts 1..PEERS, every host's link limited to RATE by tc tbf (both directions). Prints
# the joiner's throughput ÷ its own link rate (with several peers the joiner's link is the bottleneck; with
# one, both links are equal) and each serving process's stall: a thread doing fixed busy work, its iteration
# rate and longest gap while serving against before serving. Needs root (exit 3 otherwise). Tears the
# namespaces down and ends the processes it started on exit.
#   bench/state_transfer_wan.sh [PEERS=3] [RATE=100mbit] [BYTES=64M] [bench_state_transfer options...]
set -euo pipefail
cd "$(dirname "$0")/.."
peers=${1:-3}
rate=${2:-100mbit}
bytes=${3:-64M}
shift $(($# >= 3 ? 3 : $#))
bin=${LW_BENCH_STATE_TRANSFER:-build/release/bench/bench_state_transfer}
[ -x "$bin" ] || { echo "state_transfer_wan: $bin not built (cmake --build --preset release --target bench_state_transfer)" >&2; exit 2; }
scripts/wan check || { echo "state_transfer_wan: cannot create network namespaces here (needs root, ip, tc)" >&2; exit 3; }
case "$rate" in
  *gbit) mbit=$(awk "BEGIN{print ${rate%gbit}*1000}") ;;
  *mbit) mbit=${rate%mbit} ;;
  *) echo "state_transfer_wan: RATE must end in gbit or mbit" >&2; exit 2 ;;
esac
export LONGWAVE_WAN_PREFIX=lwstate
logs=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  scripts/wan down lwstate
  rm -rf "$logs"
}
trap cleanup EXIT
scripts/wan up $((peers + 1)) "$rate"
eps=""
for i in $(seq 1 "$peers"); do
  ep="tcp://$(scripts/wan addr "$i"):5700"
  eps="$eps${eps:+,}$ep"
  scripts/wan exec "$i" "$bin" --role serve --bind "$ep" --bytes "$bytes" "$@" >"$logs/peer$i.txt" 2>&1 &
  pids+=($!)
done
sleep 4  # the serving processes' busy loops measure their rate before serving
rc=0
scripts/wan exec 0 "$bin" --role fetch --endpoints "$eps" --bytes "$bytes" --link-mbit "$mbit" "$@" || rc=$?
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done  # ends their serving window
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
pids=()
for i in $(seq 1 "$peers"); do echo "peer $i:"; sed 's/^/  /' "$logs/peer$i.txt"; done
# The serving processes share the machine's cores, so their busy loops are summed: the work done while
# serving against before; and the longest gap of any of them.
cat "$logs"/peer*.txt | awk -v n="$peers" '
  $2 == "busy" && $6 == "before" { before += $4; during += $8 }
  $2 == "busy" && $4 == "longest" { if ($10 > gap) gap = $10; if ($6 > gap0) gap0 = $6 }
  END { if (before > 0) printf "serving side (%d peers): busy work while serving / before %.3f; longest gap %.1f ms while serving (%.1f ms before)\n", n, during / before, gap, gap0 }'
exit $rc
