#!/usr/bin/env bash
# A soak under churn (issue 20): a 3-node loopback cluster (tiny model, 1 worker each) trains for --minutes;
# every --every-min..--every-max seconds n1 or n2 (seeded choice) is SIGKILLed and started again with the
# same command a few seconds later, so it rejoins from the members' state. n0 and the coordinator live
# throughout: their resident memory is sampled every 10 s. At the end every role is stopped with SIGINT.
# Prints: kills and rejoins, resident memory of n0 and the coordinator (median of the first minutes after
# warm-up against the last ones: goal flat within 5 %), the longest round against the median (no stuck
# round), and whether every node that committed a round has the same theta checksum for it.
#   bench/elastic_soak.sh [--binary PATH] [--minutes M] [--every-min S] [--every-max S] [--inner-steps H]
#                         [--seed N] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

binary=$(lw_default_binary)
minutes=60
every_min=120
every_max=240
inner=40
seed=1
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --every-min) every_min=$2; shift 2 ;;
    --every-max) every_max=$2; shift 2 ;;
    --inner-steps) inner=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --keep) lw_keep=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "elastic_soak.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "elastic_soak.sh: no longwave binary at $binary (build first)" >&2; exit 2; }
[ "$every_min" -ge 10 ] && [ "$every_max" -ge "$every_min" ] ||
  { echo "elastic_soak.sh: need 10 <= --every-min <= --every-max" >&2; exit 2; }

lw_work_dir elastic-soak
dir=$lw_dir
# A copy, so that a rebuild during the soak does not hand restarted nodes another binary (whose settings
# fingerprint may differ from the coordinator's: it would turn them away).
cp "$binary" "$dir/longwave"
cp "$(dirname "$binary")/longwave-torch" "$dir/longwave-torch"  # the nodes: longwave execs it
binary=$dir/longwave
declare -A pid
lw_cluster_toml "$dir" "soak-$(basename "$dir")" --inner-steps "$inner" --rounds 1000000 --cluster "min_nodes = 1" \
  --checkpoint-every 5 --checkpoint-keep 2

start() {  # $1: role name ("coord" or a node); its log is appended to
  if [ "$1" = coord ]; then
    "$binary" coordinator "$dir/cluster.toml" >>"$dir/coord.log" 2>&1 &
  else
    "$binary" node "$dir/cluster.toml" --node "$1" >>"$dir/$1.log" 2>&1 &
  fi
  pid[$1]=$!
}
rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

start coord
for n in n0 n1 n2; do start "$n"; done
echo "soak: 3 nodes x 1 worker, tiny model, $inner inner steps per round, $minutes min, a kill and restart every" \
  "$every_min-$every_max s (seed $seed); logs in $dir"
RANDOM=$seed
t_end=$(($(date +%s) + minutes * 60))
next_kill=$(($(date +%s) + every_min + RANDOM % (every_max - every_min + 1)))
kills=0
: >"$dir/rss.tsv"
while [ "$(date +%s)" -lt "$t_end" ]; do
  now=$(date +%s)
  kill -0 "${pid[coord]}" 2>/dev/null && kill -0 "${pid[n0]}" 2>/dev/null ||
    { echo "soak: the coordinator or n0 ended early; see $dir" >&2; lw_keep=1; exit 1; }
  printf '%s\t%s\t%s\n' "$now" "$(rss_kb "${pid[n0]}")" "$(rss_kb "${pid[coord]}")" >>"$dir/rss.tsv"
  if [ "$now" -ge "$next_kill" ]; then
    victim=n$((1 + RANDOM % 2))
    kill -9 "${pid[$victim]}" 2>/dev/null || true
    wait "${pid[$victim]}" 2>/dev/null || true
    kills=$((kills + 1))
    echo "soak: $(date +%T) SIGKILL $victim (kill $kills); started again in 5 s"
    sleep 5
    start "$victim"
    next_kill=$(($(date +%s) + every_min + RANDOM % (every_max - every_min + 1)))
  fi
  sleep 10
done
# The end: Ctrl-C for every node (each saves its checkpoint), then the coordinator.
for n in n0 n1 n2; do kill -INT "${pid[$n]}" 2>/dev/null || true; done
codes=""
for n in n0 n1 n2; do
  c=0; wait "${pid[$n]}" || c=$?; codes="$codes $n=$c"
done
kill -INT "${pid[coord]}" 2>/dev/null || true
wait "${pid[coord]}" || true
echo "soak: exit codes$codes (130: stopped by SIGINT with a checkpoint)"
python3 - "$dir" "$kills" <<'PY'
import glob, json, statistics, sys
d, kills = sys.argv[1], int(sys.argv[2])
rss = [tuple(map(int, l.split())) for l in open(f"{d}/rss.tsv") if l.strip()]
t0 = rss[0][0]
def flat(col, name):
    # After 5 minutes of warm-up: the first 5 minutes' median against the last 5 minutes'.
    early = [r[col] for r in rss if 300 <= r[0] - t0 < 600]
    late = [r[col] for r in rss if r[0] >= rss[-1][0] - 300]
    if not early or not late:
        print(f"{name}: run too short for a memory verdict (needs more than 10 min)")
        return
    a, b = statistics.median(early), statistics.median(late)
    print(f"{name}: resident {a / 1024:.0f} MiB at 5-10 min, {b / 1024:.0f} MiB in the last 5 min: "
          f"{(b - a) / a * 100:+.1f} % (goal within 5 %)")
    # The trend: a leak grows with time (or joins); allocator warm-up steps up early and then stays.
    span = rss[-1][0] - t0
    quarters = []
    for q in range(4):
        v = [r[col] for r in rss if q * span / 4 <= r[0] - t0 < (q + 1) * span / 4]
        quarters.append(f"{statistics.median(v) / 1024:.0f}" if v else "-")
    print(f"{name}: median resident MiB per quarter of the run: {', '.join(quarters)}; "
          f"max {max(r[col] for r in rss) / 1024:.0f}")
flat(1, "n0")
flat(2, "coordinator")
crcs = {}
for path in glob.glob(f"{d}/run/n*/metrics.jsonl"):
    node = path.split("/")[-2]
    for line in open(path):
        j = json.loads(line)
        if j.get("kind") == "round":
            crcs.setdefault(j["round"], {}).setdefault(j["theta_crc32c"], set()).add(node)
bad = {r: v for r, v in crcs.items() if len(v) > 1}
ts = sorted(json.loads(l)["ts"] for l in open(f"{d}/run/n0/metrics.jsonl") if '"kind":"round"' in l)
gaps = [b - a for a, b in zip(ts, ts[1:])]
med = statistics.median(gaps)
joins = sum(open(f"{d}/coord.log").read().count(f"node {n} admitted") for n in ("n0", "n1", "n2"))
print(f"kills {kills}, joins admitted {joins}; rounds {len(crcs)}; round time median {med:.2f} s, longest "
      f"{max(gaps):.2f} s ({max(gaps) / med:.1f} x)")
print(f"theta agreed on every round committed by several nodes: {not bad}" +
      ("" if not bad else f" (disagreeing rounds: {sorted(bad)[:10]})"))
PY
