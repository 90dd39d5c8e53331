#!/usr/bin/env bash
# Fuzzes the decoders that read bytes from outside (issue 23): configures a clang build in build/fuzz with
# LONGWAVE_FUZZ=ON, builds the libFuzzer targets of fuzz/, and runs each from a copy of its seed corpus
# (fuzz/corpus/<target>, never modified) for N executions or N seconds. Prints per target the executions,
# exec/s and crashes (crashes, leaks, sanitizer reports, timeouts: 0 expected); exits 1 if there was one,
# keeping the inputs that caused it. Needs clang and its libFuzzer runtime (Debian 12: clang and
# libclang-rt-14-dev, which scripts/setup installs; CI runs every target briefly through scripts/sanitize).
#   bench/fuzz.sh [--seconds N | --runs N] [--seed S] [--parallel P] [--seeds | --build-only] [TARGET ...]
#     --seconds N   each target for N seconds (default: 10, a short run)
#     --runs N      each target for N executions (e.g. 1000000, the issue's goal)
#     --seed S      libFuzzer's random seed (default: a new one each run); with --runs, a repeatable run
#     --parallel P  P targets at a time (default 1; these machines have 2 cores)
#     --seeds       write fuzz/corpus/ again from the targets' seeds mode instead of fuzzing
#     --build-only  configure and build the targets, and fuzz nothing
set -euo pipefail
cd "$(dirname "$0")/.."

all=(envelope_fuzz chunk_fuzz sparse_fuzz state_request_fuzz state_reply_fuzz checkpoint_bytes_fuzz checkpoint_file_fuzz
  config_fuzz cluster_fuzz corpus_fuzz metrics_jsonl_fuzz)
limit=(-max_total_time=10)
seed=()
parallel=1
seeds=0
build_only=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    --seed) seed=(-seed="$2"); shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --seeds) seeds=1; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (apt-get install clang)" >&2; exit 2; }
done
root=$PWD
build=build/fuzz
start=$(date +%s)
CC=clang CXX=clang++ cmake -S . -B "$build" -DLONGWAVE_FUZZ=ON -DLONGWAVE_TESTS=OFF -DLONGWAVE_BENCH=OFF \
  -DLONGWAVE_WITH_NCCL=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLONGWAVE_GROUP="$(IFS=';'; echo "${targets[*]}")" \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; exit 2; }
# one goal (lw_group): CMake's Makefiles build several --target goals one after another
cmake --build "$build" -j"${JOBS:-2}" --target lw_group >"$build.build.log" 2>&1 ||
  { tail -40 "$build.build.log" >&2; exit 2; }
echo "fuzz.sh: configured and built ${#targets[@]} targets in $(($(date +%s) - start)) s ($build)"
[ "$build_only" = 1 ] && exit 0

if [ "$seeds" = 1 ]; then
  for t in "${targets[@]}"; do
    rm -rf "fuzz/corpus/$t"
    LW_FUZZ_SEEDS="$PWD/fuzz/corpus/$t" "$build/fuzz/$t"
    echo "fuzz.sh: $t: $(ls "fuzz/corpus/$t" | wc -l) seeds, $(cat fuzz/corpus/"$t"/* | wc -c) bytes"
  done
  exit 0
fi

work=$(mktemp -d /tmp/lw_fuzz.XXXXXX)
# One target: fuzz a copy of its corpus; the log holds libFuzzer's final stats.
run_one() {
  local t=$1 dir=$work/$1
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp fuzz/corpus/"$t"/* "$dir/corpus/"
  (cd "$dir" && "$root/$build/fuzz/$t" "${limit[@]}" ${seed[@]+"${seed[@]}"} -print_final_stats=1 -timeout=25 -rss_limit_mb=4096 \
    -artifact_prefix="$dir/artifacts/" corpus >"$dir/log" 2>&1) || echo $? >"$dir/rc"
}

running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
printf '%-22s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
  dir=$work/$t
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  crashes=$(find "$dir/artifacts" -type f | wc -l)
  if [ -f "$dir/rc" ] && [ "$crashes" -eq 0 ]; then crashes=1; fi  # e.g. the fuzzer itself failed
  printf '%-22s %12s %10s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    echo "fuzz.sh: $t: see $dir/log and $dir/artifacts/ (reproduce: $build/fuzz/$t FILE)" >&2
    grep -m3 -E 'ERROR|SUMMARY|property broken|runtime error' "$dir/log" >&2 || true
  fi
done
if [ "$failed" = 0 ]; then rm -rf "$work"; fi
exit "$failed"
