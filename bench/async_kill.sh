#!/usr/bin/env bash
# A4 (issue 39): a node SIGKILLed under diloco.outer = "async" against the survivors' waits. Three loopback
# nodes (tiny model, 1 worker each) paced at speeds 1, 1 and 0.5; node n1 dies once in an inner phase (SIGKILL
# after version --kill-at) and once inside a merge's all-reduce (fault injection in version --kill-at after
# --chunks chunks). Prints, for each survivor, the longest interval between two of its phases' ends after the
# kill against the median before (what the death cost it: async nodes train on, so about 0), and of the
# master's merges after the kill the longest grace window (from its quorum to its close, a hold behind a
# merge still in flight included), against [async] grace_max_s; then whether every version's theta CRC agrees.
# Kills only the processes it started.
#   bench/async_kill.sh [--binary PATH] [--inner-steps H] [--pace S] [--grace-max S] [--heartbeat S]
#                       [--kill-at V] [--chunks C] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

binary=$(lw_default_binary)
inner=10
pace=0.1
grace_max=2
heartbeat=6
kill_at=8
chunks=5
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --inner-steps) inner=$2; shift 2 ;;
    --pace) pace=$2; shift 2 ;;
    --grace-max) grace_max=$2; shift 2 ;;
    --heartbeat) heartbeat=$2; shift 2 ;;
    --kill-at) kill_at=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --keep) lw_keep=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "async_kill.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "async_kill.sh: no longwave binary at $binary (build first)" >&2; exit 2; }

lw_work_dir async-kill
dir=$lw_dir

# Versions applied by a node so far (its "version" records).
versions_of() { if [ -f "$1" ]; then grep -c '"kind":"version"' "$1" || true; else echo 0; fi; }

# One case: $1 name, $2 "inner" (SIGKILL once n1 applied version kill_at) or "allreduce" (fault injection).
run_case() {
  local name=$1 how=$2 d="$dir/$1"
  mkdir -p "$d"
  lw_cluster_toml "$d" "bench-$(basename "$d")" --inner-steps "$inner" --rounds 60 --checkpoint-every 1000 \
    --cluster "heartbeat_timeout_s = $heartbeat"
  sed -i "s/^threads = 1$/threads = 1\npace_step_s = $pace/; s/^name = \"n2\"$/name = \"n2\"\nspeed = 0.5/" \
    "$d/cluster.toml"
  printf '[diloco]\nouter = "async"\n[async]\nquorum = 1\ngrace_max_s = %s\nmax_staleness = 1000\n' \
    "$grace_max" >>"$d/cluster.toml"
  "$binary" coordinator "$d/cluster.toml" >"$d/coord.log" 2>&1 & local coord=$!
  local n0 n1 n2
  "$binary" node "$d/cluster.toml" --node n0 >"$d/n0.log" 2>&1 & n0=$!
  "$binary" node "$d/cluster.toml" --node n2 >"$d/n2.log" 2>&1 & n2=$!
  if [ "$how" = inner ]; then
    "$binary" node "$d/cluster.toml" --node n1 >"$d/n1.log" 2>&1 & n1=$!
    until [ "$(versions_of "$d/run/n1/metrics.jsonl")" -ge "$kill_at" ]; do
      kill -0 "$n1" 2>/dev/null || { echo "$name: n1 ended before version $kill_at; see $d" >&2; lw_keep=1; return 1; }
      sleep 0.1
    done
    kill -9 "$n1"
  else
    LONGWAVE_FAULT_DIE_IN_ALLREDUCE="$kill_at:$chunks" "$binary" node "$d/cluster.toml" --node n1 \
      >"$d/n1.log" 2>&1 & n1=$!
  fi
  wait "$n1" 2>/dev/null || true
  local killed; killed=$(date +%s.%N)
  wait "$n0" && wait "$n2" && wait "$coord" ||
    { echo "$name: a survivor or the coordinator failed; see $d" >&2; lw_keep=1; return 1; }
  python3 - "$name" "$killed" "$grace_max" "$d/run" <<'PY'
import json, statistics, sys
name, killed, grace_max, run = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def records(path):
    return [json.loads(l) for l in open(path)]
waits, crcs = [], {}
for node in ("n0", "n2"):
    recs = records(f"{run}/{node}/metrics.jsonl")
    ends = [r["ts"] for r in recs if r.get("kind") == "contribution"]
    for r in recs:
        if r.get("kind") == "version":
            crcs.setdefault(r["version"], set()).add(r["theta_crc32c"])
    gaps = [(a, b - a) for a, b in zip(ends, ends[1:])]
    before = statistics.median(g for a, g in gaps if a + g < killed)
    after = max(g for a, g in gaps if a + g >= killed)
    waits.append(after - before)
    print(f"{name:9s} {node}: phases {before:5.2f} s apart before the kill, at most {after:5.2f} s after: "
          f"waited {after - before:+5.2f} s")
merges = [r for r in records(f"{run}/coordinator.jsonl") if r.get("kind") == "merge"]
later = [m for m in merges if m["ts"] >= killed]
grace = max((m["grace_ms"] / 1000 for m in later), default=0.0)
print(f"{name:9s} the master: {len(later)} merges after the kill, the longest grace {grace:.2f} s "
      f"(grace_max_s {grace_max:g}); longest survivor wait {max(waits):+.2f} s: "
      f"{'within' if max(waits) <= grace_max else 'ABOVE'} grace_max_s; one theta per version: "
      f"{all(len(s) == 1 for s in crcs.values())}")
PY
}

echo "3 nodes x 1 worker at speeds 1, 1, 0.5 (pace $pace s), tiny model, H = $inner, grace_max_s = $grace_max," \
  "heartbeat_timeout_s = $heartbeat; n1 dies at version $kill_at"
run_case inner inner
run_case allreduce allreduce
