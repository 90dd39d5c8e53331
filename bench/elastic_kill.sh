#!/usr/bin/env bash
# A dead node against the survivors' progress (issue 20): a 3-node cluster on loopback (tiny model, 1 worker
# each) in which node n2 is SIGKILLed, once in an inner phase and once inside an all-reduce (fault injection
# after --chunks chunks). Prints, for each, the seconds from the kill to the survivors' next committed round,
# the median round time before the kill, how much longer the round with the kill took (the time the death
# cost), and that cost ÷ [cluster] heartbeat_timeout_s, measured in the same run. Kills only the processes it started.
#   bench/elastic_kill.sh [--binary PATH] [--inner-steps H] [--heartbeat S] [--chunks C] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

binary=$(lw_default_binary)
inner=40
heartbeat=6
chunks=9
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --inner-steps) inner=$2; shift 2 ;;
    --heartbeat) heartbeat=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --keep) lw_keep=1; shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "elastic_kill.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "elastic_kill.sh: no longwave binary at $binary (build first)" >&2; exit 2; }

lw_work_dir elastic-kill
dir=$lw_dir

# Unix time of each committed round of a node: "round ts" lines.
round_times() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("kind") == "round": print(j["round"], j["ts"])' "$1"; }

# One case: $1 name, $2 "inner" (SIGKILL after 3 rounds) or "allreduce" (fault injection in round 4).
run_case() {
  local name=$1 how=$2 d="$dir/$1"
  mkdir -p "$d"
  lw_cluster_toml "$d" "bench-$(basename "$d")" --inner-steps "$inner" --rounds 10 \
    --cluster "heartbeat_timeout_s = $heartbeat"
  "$binary" coordinator "$d/cluster.toml" >"$d/coord.log" 2>&1 & local coord=$!
  local n0 n1 n2
  "$binary" node "$d/cluster.toml" --node n0 >"$d/n0.log" 2>&1 & n0=$!
  "$binary" node "$d/cluster.toml" --node n1 >"$d/n1.log" 2>&1 & n1=$!
  if [ "$how" = inner ]; then
    "$binary" node "$d/cluster.toml" --node n2 >"$d/n2.log" 2>&1 & n2=$!
    # Half way through round 4's inner phase.
    until [ -f "$d/run/n2/metrics.jsonl" ] && [ "$(round_times "$d/run/n2/metrics.jsonl" | wc -l)" -ge 3 ]; do
      sleep 0.2
    done
    local r3; r3=$(round_times "$d/run/n0/metrics.jsonl" | awk '$1==3{print $2}')
    local before; before=$(round_times "$d/run/n0/metrics.jsonl" | awk 'NR>1{print $2-p} {p=$2}' | sort -n |
      awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
    python3 -c "import time,sys; time.sleep(max(0, float(sys.argv[1]) + float(sys.argv[2]) / 2 - time.time()))" \
      "$r3" "$before"
    kill -9 "$n2"
  else
    LONGWAVE_FAULT_DIE_IN_ALLREDUCE="4:$chunks" "$binary" node "$d/cluster.toml" --node n2 >"$d/n2.log" 2>&1 &
    n2=$!
  fi
  wait "$n2" 2>/dev/null || true
  local killed; killed=$(date +%s.%N)
  wait "$n0" && wait "$n1" && wait "$coord" || { echo "$name: a survivor or the coordinator failed; see $d" >&2; lw_keep=1; return 1; }
  python3 - "$name" "$killed" "$heartbeat" "$d/run/n0/metrics.jsonl" "$d/run/n1/metrics.jsonl" <<'PY'
import json, statistics, sys
name, killed, hb = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
runs = []
for path in sys.argv[4:]:
    rounds = {j["round"]: (j["ts"], j.get("theta_crc32c")) for j in map(json.loads, open(path)) if j.get("kind") == "round"}
    runs.append(rounds)
agree = all(runs[0][r][1] == runs[1][r][1] for r in runs[0])
ts = sorted(t for t, _ in runs[0].values())
before = [b - a for a, b in zip(ts, ts[1:]) if b < killed]
after = min(t for t in ts if t > killed)
prev = max(t for t in ts if t < killed)
normal = statistics.median(before)
cost = (after - prev) - normal  # how much longer the round in which the node died took
print(f"{name:10s} kill -> next committed round {after - killed:6.2f} s | rounds before {normal:5.2f} s, "
      f"the one with the kill {after - prev:5.2f} s | cost {cost:+6.2f} s = {cost / hb:.2f} x "
      f"heartbeat_timeout ({hb:g} s) | survivors' theta agrees every round: {agree}")
PY
}

echo "3 nodes x 1 worker, tiny model, $inner inner steps per round, heartbeat_timeout_s = $heartbeat"
run_case inner inner
run_case allreduce allreduce
