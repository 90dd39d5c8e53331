#!/usr/bin/env bash
# Issue 37: how much of the master's membership state machine (cluster/master_state*.cpp) its event-table tests
# (tests/unit/master_state_test.cpp) reach on their own. Compiles both with --coverage in a scratch folder,
# links the torch-free libraries of the ci build, runs the tests, and prints gcov's line coverage per file and
# in all. Build first: cmake --build --preset ci.
#   bench/master_coverage.sh [--keep]   (--keep: leave the scratch folder and its .gcov files, and say where)
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
case "${1:-}" in
  --keep) keep=1 ;;
  -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
  "") ;;
  *) echo "master_coverage: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
for lib in liblw_comm.a liblw_checksum.a liblw_errors.a; do
  [ -f "build/ci/$lib" ] || { echo "master_coverage: build/ci/$lib is missing: cmake --build --preset ci" >&2; exit 2; }
done
src=$PWD
work=$(mktemp -d /tmp/longwave-master-coverage.XXXXXX)
[ "$keep" -eq 1 ] || trap 'rm -rf "$work"' EXIT
flags=(-std=c++17 -O0 -g -DFMT_SHARED -DCATCH_CONFIG_PREFIX_ALL -DCATCH_CONFIG_EXTERNAL_INTERFACES -I"$src" -I"$src/build/ci")
echo "master_coverage: compiling the state machine with --coverage"
for f in cluster/master_state*.cpp; do
  c++ "${flags[@]}" --coverage -c "$f" -o "$work/$(basename "$f" .cpp).o"
done
c++ "${flags[@]}" -c tests/unit/master_state_test.cpp -o "$work/test.o"
printf '#define CATCH_CONFIG_MAIN\n#include <catch2/catch.hpp>\n' >"$work/main.cpp"
c++ "${flags[@]}" -c "$work/main.cpp" -o "$work/main.o"
c++ --coverage -o "$work/t" "$work"/*.o build/ci/liblw_membership.a build/ci/liblw_comm.a build/ci/liblw_checksum.a build/ci/liblw_errors.a \
  -lzmq -lcapnp -lkj -lfmt -lpthread
"$work/t" | tail -2
cd "$work"
total=0
covered=0
for o in master_state*.o; do
  line=$(gcov -o "$work" "$src/cluster/${o%.o}.cpp" 2>/dev/null | grep -A1 "^File '.*cluster/${o%.o}.cpp'" | tail -1)
  pct=$(sed -E 's/Lines executed:([0-9.]+)% of ([0-9]+)/\1/' <<<"$line")
  n=$(sed -E 's/Lines executed:([0-9.]+)% of ([0-9]+)/\2/' <<<"$line")
  printf 'master_coverage: cluster/%s.cpp: %s %% of %s lines\n' "${o%.o}" "$pct" "$n"
  total=$((total + n))
  covered=$(python3 -c "print($covered + round($pct * $n / 100))")
done
python3 -c "print(f'master_coverage: all: {100 * $covered / $total:.1f} % of $total lines')"
[ "$keep" -eq 0 ] || echo "master_coverage: files in $work"
