#!/usr/bin/env bash
# What a join costs the members (issue 20): a 3-node cluster on loopback (tiny model, 1 worker each) in which
# n2 is SIGKILLed after 3 rounds; once the coordinator has removed it and the survivors have run 3 rounds
# alone, n2 is started again with --fresh, so it fetches the state from the members' state servers and is
# admitted at a fence. Prints the state's size, fetch time and rate; the survivors' round times (before the
# kill, alone, the round(s) in which n2 starts, fetches and is admitted, the round after) with the stall
# (extra seconds over the alone median, and as a ratio); the survivors' longest gap between inner steps
# meanwhile; whether n2's θ agrees with n0's. Kills only the processes it started.
#   bench/elastic_join.sh [--binary PATH] [--inner-steps H] [--rounds N] [--dim D] [--runs K] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

binary=$(lw_default_binary)
inner=40
rounds=15
dim=0
runs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --inner-steps) inner=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --dim) dim=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --keep) lw_keep=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "elastic_join.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "elastic_join.sh: no longwave binary at $binary (build first)" >&2; exit 2; }

lw_work_dir elastic-join
dir=$lw_dir

n_rounds() {  # committed rounds in a metrics.jsonl (0 before it exists)
  [ -f "$1" ] || { echo 0; return; }
  grep -c '"kind":"round"' "$1" || true
}

# Waits up to $2 seconds for the command $1 to succeed; else says $3 and fails.
wait_for() {
  local end=$((SECONDS + $2))
  until eval "$1"; do
    [ "$SECONDS" -lt "$end" ] || { echo "$3" >&2; return 1; }
    sleep 0.2
  done
}

# One run: $1 its number.
run_case() {
  local d="$dir/run$1"
  mkdir -p "$d"
  local model=()
  [ "$dim" != 0 ] && model=(--model "dim = $dim")
  lw_cluster_toml "$d" "bench-$(basename "$d")" --inner-steps "$inner" --rounds "$rounds" "${model[@]}"
  local m0="$d/run/n0/metrics.jsonl"
  "$binary" coordinator "$d/cluster.toml" >"$d/coord.log" 2>&1 & local coord=$!
  local n0 n1 n2 again
  "$binary" node "$d/cluster.toml" --node n0 >"$d/n0.log" 2>&1 & n0=$!
  "$binary" node "$d/cluster.toml" --node n1 >"$d/n1.log" 2>&1 & n1=$!
  "$binary" node "$d/cluster.toml" --node n2 >"$d/n2.log" 2>&1 & n2=$!
  # n2 dies in round 4's inner phase, with 3 checkpoints on disk.
  wait_for '[ "$(n_rounds "$d/run/n2/metrics.jsonl")" -ge 3 ]' 300 "run $1: n2 did not commit 3 rounds; see $d" ||
    { lw_keep=1; return 1; }
  sleep 1
  kill -9 "$n2"
  wait "$n2" 2>/dev/null || true
  local killed; killed=$(date +%s.%N)
  wait_for 'grep -q "node n2 lost" "$d/coord.log"' 60 "run $1: the coordinator did not remove n2; see $d" ||
    { lw_keep=1; return 1; }
  # The round in flight at the removal, then three rounds of the survivors alone.
  local alone; alone=$(( $(n_rounds "$m0") + 4 ))
  wait_for '[ "$(n_rounds "$m0")" -ge "$alone" ]' 300 "run $1: the survivors did not go on; see $d" ||
    { lw_keep=1; return 1; }
  [ $((alone + 2)) -le "$rounds" ] || { echo "run $1: no rounds left for the join; raise --rounds" >&2; lw_keep=1; return 1; }
  local started; started=$(date +%s.%N)
  "$binary" node "$d/cluster.toml" --node n2 --fresh >"$d/n2-again.log" 2>&1 & again=$!
  local codes=() p
  for p in "$n0" "$n1" "$again" "$coord"; do
    local code=0
    wait_for '! kill -0 "$p" 2>/dev/null' 600 "run $1: process $p still running after 10 min; see $d" ||
      { lw_keep=1; return 1; }
    wait "$p" 2>/dev/null || code=$?
    codes+=("$code")
  done
  [ "${codes[*]}" = "0 0 0 0" ] ||
    { echo "run $1: exit codes n0 n1 n2(again) coordinator: ${codes[*]}; see $d" >&2; lw_keep=1; }
  python3 - "$1" "$killed" "$started" "$d" <<'PY'
import json, re, statistics, sys
run, killed, started, d = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def lines(node):
    return [json.loads(l) for l in open(f"{d}/run/{node}/metrics.jsonl")]

def rounds(node):  # round -> (ts, theta crc); a restarted node's file may hold rounds of both lives
    return {j["round"]: (j["ts"], j.get("theta_crc32c")) for j in lines(node) if j.get("kind") == "round"}

log = open(f"{d}/n2-again.log").read()
m = re.search(r"fetched the state of round (\d+): ([\d.]+) MB in ([\d.]+) s", log)
if not m or "admitted in epoch" not in log:
    print(f"run {run}: n2 did not fetch and join (see {d}/n2-again.log)")
    sys.exit(0)
state_round, mb, secs = int(m.group(1)), float(m.group(2)), float(m.group(3))
r0 = rounds("n0")
# The survivors' view of the admission: their membership line that has n2 again after the kill.
admitted = min(j["ts"] for j in lines("n0")
               if j.get("kind") == "membership" and "n2" in j["members"].split(",") and j["ts"] > killed)
ts = sorted((t, r) for r, (t, _) in r0.items())
dur = {r: t - p for (p, _), (t, r) in zip(ts, ts[1:])}
end = {r: t for t, r in ts}
three = statistics.median(dur[r] for r in dur if end[r] < killed)             # 3 nodes, before the kill
lost = min(r for r in dur if end[r] > killed)                                  # the round with the kill
alone = [dur[r] for r in dur if r > lost and end[r] < started]             # 2 nodes (after the removal)
alone_rounds = [r for r in dur if r > lost and end[r] < started]
normal = statistics.median(alone)
# The rounds in which n2 started, fetched and was admitted (the one the admission falls in last), then the
# round after it.
join = sorted(r for r in dur if end[r] > started and end[r] - dur[r] <= admitted)
after = max(join) + 1
later = [dur[r] for r in dur if r > after]
stall = sum(dur[r] - normal for r in join)
kept = [j["kept_round"] for j in lines("n0") if j.get("kind") == "membership" and j["ts"] == admitted][0]
print(f"run {run}: state of round {state_round}: {mb:.1f} MB fetched in {secs:.2f} s = {mb / secs:.0f} MB/s; "
      f"n2 start -> admitted {admitted - started:.1f} s (fence kept the all-reduces up to round {kept})")
print(f"  n0's rounds: 3 nodes before the kill {three:.2f} s (median), 2 alone {normal:.2f} s (median of "
      f"{len(alone)}), 3 again after the join {statistics.median(later) if later else float('nan'):.2f} s")
for r in join:
    print(f"  round {r} (n2 starts/fetches/is admitted): {dur[r]:.2f} s = {dur[r] - normal:+.2f} s, "
          f"{dur[r] / normal:.2f} x alone")
if after in dur:
    print(f"  round {after} (the round after; n2 trains): {dur[after]:.2f} s = {dur[after] - normal:+.2f} s, "
          f"{dur[after] / normal:.2f} x alone; {dur[after] - three:+.2f} s, {dur[after] / three:.2f} x 3 nodes")
print(f"  stall (rounds {min(join)}-{max(join)} over the alone median): {stall:+.2f} s, "
      f"{sum(dur[r] for r in join) / (normal * len(join)):.2f} x")
# Finer: the longest gap between two inner steps of each survivor while n2 starts, fetches and is admitted,
# against the median step gap of the rounds alone (a step that starts a round also holds the round's
# boundary: left out).
for node in ("n0", "n1"):
    steps = [(j["round"], j["ts"]) for j in lines(node) if j.get("kind") == "step"]
    gaps = [(t - pt, t) for (pr, pt), (r, t) in zip(steps, steps[1:]) if r == pr]
    base = statistics.median(g for g, t in gaps if end[min(alone_rounds)] - dur[min(alone_rounds)] < t < started)
    during = [g for g, t in gaps if started < t and t - g < admitted]
    print(f"  {node}'s steps while n2 starts/fetches/is admitted: longest gap {max(during, default=0):.3f} s "
          f"({len(during)} steps), median alone {base:.3f} s")
r2 = {r: v for r, v in rounds("n2").items() if r > state_round}
agree = [r for r in r2 if r in r0 and r0[r][1] == r2[r][1]]
print(f"  n2's theta after the join: {len(agree)} of {len(r2)} rounds ({min(r2, default=0)}-{max(r2, default=0)}) "
      f"agree with n0" + ("" if len(agree) == len(r2) and r2 else "  <-- DISAGREE"))
PY
}

[ "$dim" = 0 ] && shape="" || shape=" (dim $dim)"
echo "3 nodes x 1 worker, tiny model$shape, $inner inner steps per round, $rounds rounds"
for i in $(seq 1 "$runs"); do run_case "$i"; done
