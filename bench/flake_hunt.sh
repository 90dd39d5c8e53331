#!/usr/bin/env bash
# Flake hunt (issue 35): runs a selection of the ctest suite (preset ci) several times, with one core kept
# busy by a spinning process, and prints per test binary how many tests ran, how often, and which failed.
# Every run's JUnit file and log stay in the output folder.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: bench/flake_hunt.sh [--runs N] [--no-busy] [--out DIR] [-L LABEL | -R REGEX]... [--binaries a,b]
                          [--only BINARY=SPEC]...
  --runs N    runs of the selection (default 10)
  --no-busy   leave the machine quiet (default: one spinning process keeps a core busy throughout)
  --out DIR   where each run's log and JUnit file go (default bench/results/flake_hunt-<date>)
  -L, -R      ctest's label and name regular expressions (default: -L 'process|wan', both labels)
  --binaries  run these test binaries of build/ci/tests (e.g. lw_elastic_test,lw_cluster_test) directly, each
              whole, instead of a ctest selection
  --only B=S  with --binaries: run only the tests of binary B that Catch's test spec S selects (e.g.
              'lw_cli_test=/metrics can be scraped*'); B must be one of --binaries
  --build DIR with --binaries: take longwave and tests/<binary> from DIR instead of build/ci (a copy, so that
              build/ci can be rebuilt while the hunt runs)
Prints one line per run, then a table: test binary | tests | runs | failures | failing tests (runs).
Build first: cmake --build --preset ci.
EOF
}

runs=10
busy=1
out=""
sel=()
binaries=()
declare -A only=()
bdir=build/ci
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --no-busy) busy=0; shift ;;
    --out) out="$2"; shift 2 ;;
    -L|-R) sel+=("$1" "$2"); shift 2 ;;
    --binaries) IFS=, read -r -a binaries <<<"$2"; shift 2 ;;
    --build) bdir="$2"; shift 2 ;;
    --only)
      [[ "$2" == *=* ]] || { echo "flake_hunt: --only $2: want BINARY=SPEC" >&2; exit 2; }
      only["${2%%=*}"]="${2#*=}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "flake_hunt: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "flake_hunt: --runs $runs: want a positive number" >&2; exit 2; }
[ ${#sel[@]} -gt 0 ] || sel=(-L 'process|wan')
[ -n "$out" ] || out="bench/results/flake_hunt-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
[ -x "$bdir/longwave" ] || { echo "flake_hunt: $bdir/longwave is missing: cmake --build --preset ci" >&2; exit 2; }
for b in "${binaries[@]}"; do
  [ -x "$bdir/tests/$b" ] || { echo "flake_hunt: $bdir/tests/$b is not a test binary" >&2; exit 2; }
done
for b in "${!only[@]}"; do
  [[ " ${binaries[*]} " == *" $b "* ]] || { echo "flake_hunt: --only $b: not one of --binaries" >&2; exit 2; }
done

spinner=""
cleanup() { [ -z "$spinner" ] || kill "$spinner" 2>/dev/null || true; }
trap cleanup EXIT
if [ "$busy" -eq 1 ]; then
  bash -c 'while :; do :; done' &
  spinner=$!
  echo "flake_hunt: pid $spinner keeps a core busy"
fi

# Test name -> binary, from ctest's own listing (a direct run names its binary in its file name).
ctest --preset ci -N "${sel[@]}" --show-only=json-v1 >"$out/tests.json"

for i in $(seq 1 "$runs"); do
  t0=$(date +%s)
  rc=0
  if [ ${#binaries[@]} -gt 0 ]; then
    for b in "${binaries[@]}"; do
      spec=()
      [ -z "${only[$b]:-}" ] || spec=("${only[$b]}")
      LW_BINARY="$PWD/$bdir/longwave" LW_SOURCE_DIR="$PWD" "$bdir/tests/$b" "${spec[@]}" -r junit \
        -o "$out/run$i-$b.xml" >>"$out/run$i.log" 2>&1 || rc=$?
    done
  else
    ctest --preset ci "${sel[@]}" --output-junit "$PWD/$out/run$i.xml" >"$out/run$i.log" 2>&1 || rc=$?
  fi
  echo "flake_hunt: run $i of $runs: exit $rc in $(( $(date +%s) - t0 )) s"
done

python3 - "$out" "$runs" <<'EOF'
import glob, json, os, sys, xml.etree.ElementTree as ET
out, runs = sys.argv[1], int(sys.argv[2])
tests = json.load(open(os.path.join(out, "tests.json")))["tests"]
binary = {t["name"]: os.path.basename(t["command"][0]) if t.get("command") else "?" for t in tests}
stats = {}  # binary -> [names that ran, test runs, failures, {test: failures}]
for f in sorted(glob.glob(os.path.join(out, "run*.xml"))):
    direct = os.path.basename(f).split("-", 1)[1][:-4] if "-" in os.path.basename(f) else None
    try:
        cases = list(ET.parse(f).getroot().iter("testcase"))
    except ET.ParseError:
        print(f"{os.path.basename(f)}: incomplete (a run stopped mid-way), left out")
        continue
    for case in cases:
        name = case.get("name")
        b = direct or binary.get(name, "?")
        s = stats.setdefault(b, [set(), 0, 0, {}])
        if case.get("status") == "notrun" or case.find("skipped") is not None:
            continue
        s[0].add(name)
        s[1] += 1
        if case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
            s[2] += 1
            s[3][name] = s[3].get(name, 0) + 1
print(f"| test binary | tests | runs of the selection | test runs | failures | failing tests (times) |")
print("|---|---|---|---|---|---|")
for b in sorted(stats):
    n, tr, fl, which = stats[b]
    if tr == 0:
        continue
    names = "; ".join(f"{k} ({v})" for k, v in sorted(which.items())) or "-"
    print(f"| {b} | {len(n)} | {runs} | {tr} | {fl} | {names} |")
EOF
