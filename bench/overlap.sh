#!/usr/bin/env bash
# Outer-step overlap across network namespaces (issue 4): a 4-node cluster (1 worker each) on scripts/wan hosts
# whose tbf rate is chosen so that one all-reduce of the model takes about half of an H-step inner phase. Every
# policy in --policies trains the same seed, data and rounds in the same run; the script prints, per policy,
# compute utilization (inner compute s ÷ wall s), stall seconds, wall time and wall time to a fixed val loss,
# with ratios against sync, and writes a CSV. Needs root (exit 3 if namespaces cannot be created); tears its
# namespaces down on exit and kills only the processes it started.
#   bench/overlap.sh [--policies sync,delayed] [--rounds R] [--inner-steps H] [--rate RATE|auto] [--dtype fp32]
#                    [--dtypes fp32,int8,sparse] [--csv PATH] [--target LOSS] [--eval-batches N] [--keep]
#                    [--speeds 1,1,0.5,0.25 --pace S] [--policy-rounds dylu=R] [--seed S] ...
#   bench/overlap.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: bench/overlap.sh [options]          (root; 4 network-namespace hosts from scripts/wan)

  --policies LIST     comma-separated [diloco] outer policies    (default sync,delayed,eager,streaming)
                      sync is the baseline of the ratios and of the default target; put it first.
                      dylu: sync with diloco.adaptive_steps; P+dylu: policy P with it (delayed, eager);
                      async: diloco.outer = "async", its token budget that of its rounds (R rounds x nodes
                      x H steps x batch x seq_len), its merge rules --async-rules
  --async-rules R     async's [async] quorum:grace_min_s:grace_max_s:max_staleness:dn_period[:cgad]
                                                                                  (default 1:0:5:8:0)
  --async-set K=V     one more [async] key of async's runs (repeatable), e.g. rebase_steps=0 or max_in_flight=0
  --speeds LIST       one node per value, its [[nodes]] speed (with --pace)              (default 4 nodes at 1)
  --nodes N           N nodes at speed 1 (without --speeds)                             (default 4)
  --pace S            [train] pace_step_s: an inner step of a node of speed v takes S / v s (0: off)
  --policy-rounds P=R rounds of policy P's runs (repeatable), e.g. dylu=15: adaptive steps train fewer tokens
                      a round, so an equal token budget takes more rounds       (default --rounds)
  --seed S            [run] seed of every run                                            (default 1234)
  --rounds R          outer rounds per policy                                          (default 10)
  --inner-steps H     inner steps per round                                            (default 20)
  --rate RATE|auto    tbf rate of every host link, e.g. 40mbit; auto: calibrate so that one all-reduce
                      ≈ --ratio × one H-step phase                                     (default auto)
  --ratio X           all-reduce time ÷ phase time aimed at by --rate auto             (default 0.5)
  --efficiency E      ring goodput ÷ link rate assumed by --rate auto (bench/RESULTS.md measured
                      0.88 for the tiny model's 10.9 MB at 23 Mbit/s)                   (default 0.88)
  --dtype D           [comm] dtype on the wire: fp32 | fp16 | bf16 | int8 | sparse     (default fp32)
  --dtypes LIST       comma-separated dtypes: every policy runs with each (runs are named POLICY-DTYPE);
                      the first dtype's sync run is the baseline, and with int8 in the list each run is
                      also compared with int8 under the same policy                     (default: --dtype)
  --rounds-of D=R     rounds of the runs with dtype D (repeatable), e.g. sparse=36: a codec that sends less
                      may need more rounds to reach the target, and its rounds cost less  (default --rounds)
  --density X         sparse: [comm] density, kept values per chunk                    (default 0.0156)
  --value-bits B      sparse: [comm] value_bits, 2 or 4                                (default 2)
  --sparse-outer LR:MU  sparse runs' outer lr and momentum, whatever the policy: top-k with error
                      feedback applies part of each average, and a larger outer lr makes up for it
                      (bench/RESULTS.md)                                  (default: the policy's)
  --target LOSS       val loss for "time to target"; default: sync's final val loss × --target-factor
  --target-factor X   the default target's factor on sync's final val loss (1: issue 39's A1)  (default 1.02)
  --eval-batches N    validation batches per evaluation (one evaluation every round)   (default 4)
  --batch B           sequences per worker per inner step                              (default 8)
  --seq-len T         sequence length                                                  (default 128)
  --preset P          model preset                                                     (default tiny)
  --inner-lr X        peak AdamW learning rate of the inner steps; 2e-3 beats 4e-3 for every
                      policy at the defaults (bench/RESULTS.md, session 11)            (default 2e-3)
  --outer-lr X        outer SGD learning rate of sync and of policies without --outer  (default 1.0)
  --outer-momentum X  outer Nesterov momentum, likewise                                (default 0)
  --outer P=LR:MU[:hb] outer lr and momentum for policy P only, e.g. --outer streaming=1.0:0 (repeatable);
                      MU may be negative; :hb makes it heavy-ball momentum (outer.nesterov = false)
                      (defaults: delayed=0.9:-0.6:hb eager=1.3:-0.7:hb streaming=1.3:0)
  --sync-eval         evaluate on the training path ([eval] async = false; default: off it)
  --fragments P       streaming: fragments of layers                                   (default 2)
  --tau T             streaming: inner steps a fragment's all-reduce overlaps; auto = 3/4 of H/P, which
                      covers one fragment's all-reduce at --ratio 0.5                  (default auto)
  --alpha A           streaming: mixing of local and global fragment                   (default 0.5)
  --csv PATH          CSV output                                                       (default bench/overlap.csv)
  --keep              keep the work directory (configs, logs, metrics.jsonl) and print its path
  --loopback          no network namespaces (a GPU machine has none): every role on 127.0.0.1, each node's
                      ring links held to the rate by the transport (LONGWAVE_FAULT_RING_RATE; bench/RESULTS.md:
                      within 0.5 % of tc tbf's busbw); needs no root
  --device D          [train] device of every node: cpu, cuda, cuda:N or auto     (default cpu)
  --threads T         [train] threads of every node                                    (default 1)
  -h, --help          this text

Binary: ${LW_BINARY:-build/release/longwave} (built with `cmake --build --preset release --target longwave` if
missing; copied into the work directory so that every policy runs the same build).
Utilization = Σ compute_s ÷ Σ wall_s over every worker and every round but the first (warm-up), from the
"worker" lines of each node's metrics.jsonl; "all" includes round 1; with --sync-eval, "no-eval" also
removes the per-round evaluation (then on the training path) from the wall time; by default evaluation runs
off the training path and "no-eval" equals "util".
EOF
}

policies=sync,delayed,eager,streaming
speeds=""
nodes=4
pace=0
seed=1234
declare -A policy_rounds=()
rounds=10
inner=20
rate=auto
ratio=0.5
efficiency=0.88
dtype=fp32
dtypes=""
declare -A dtype_rounds=()
density=0.0156
value_bits=2
sparse_outer=""
target=""
target_factor=1.02
eval_batches=4
batch=8
seq_len=128
preset=tiny
inner_lr=2e-3
outer_lr=1.0
outer_momentum=0
# Each policy's best at the defaults (bench/RESULTS.md, sessions 10 and 11); --outer P=... replaces one.
declare -A policy_outer=([delayed]=0.9:-0.6:hb [eager]=1.3:-0.7:hb [streaming]=1.3:0)
sync_eval=0
async_rules=1:0:5:8:0
async_more=""
fragments=2
tau=auto
alpha=0.5
csv=bench/overlap.csv
keep=0
loopback=0
device=cpu
threads=1
die() { echo "overlap: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --policies) policies=${2:?}; shift 2 ;;
    --speeds) speeds=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --pace) pace=${2:?}; shift 2 ;;
    --seed) seed=${2:?}; shift 2 ;;
    --policy-rounds)
      [[ ${2:-} =~ ^([a-z_+]+)=([0-9]+)$ ]] && [ "${BASH_REMATCH[2]}" -ge 2 ] ||
        die "--policy-rounds takes POLICY=ROUNDS with ROUNDS ≥ 2, e.g. dylu=15"
      policy_rounds[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --inner-steps) inner=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --ratio) ratio=${2:?}; shift 2 ;;
    --efficiency) efficiency=${2:?}; shift 2 ;;
    --dtype) dtype=${2:?}; shift 2 ;;
    --dtypes) dtypes=${2:?}; shift 2 ;;
    --rounds-of)
      [[ ${2:-} =~ ^([a-z0-9]+)=([0-9]+)$ ]] && [ "${BASH_REMATCH[2]}" -ge 2 ] ||
        die "--rounds-of takes DTYPE=ROUNDS with ROUNDS ≥ 2, e.g. sparse=36"
      dtype_rounds[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift 2 ;;
    --density) density=${2:?}; shift 2 ;;
    --value-bits) value_bits=${2:?}; shift 2 ;;
    --sparse-outer)
      [[ ${2:-} =~ ^[0-9]*\.?[0-9]+:-?[0-9]*\.?[0-9]+$ ]] || die "--sparse-outer takes LR:MU, e.g. 2.0:0"
      sparse_outer=$2; shift 2 ;;
    --target) target=${2:?}; shift 2 ;;
    --target-factor) target_factor=${2:?}; shift 2 ;;
    --eval-batches) eval_batches=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --seq-len) seq_len=${2:?}; shift 2 ;;
    --preset) preset=${2:?}; shift 2 ;;
    --inner-lr) inner_lr=${2:?}; shift 2 ;;
    --outer-lr) outer_lr=${2:?}; shift 2 ;;
    --outer-momentum) outer_momentum=${2:?}; shift 2 ;;
    --outer)
      [[ ${2:-} =~ ^([a-z_]+)=([0-9]*\.?[0-9]+):(-?[0-9]*\.?[0-9]+)(:hb)?$ ]] ||
        die "--outer takes POLICY=LR:MU[:hb], e.g. streaming=1.0:0 or eager=0.8:-0.5:hb"
      policy_outer[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}:${BASH_REMATCH[3]}${BASH_REMATCH[4]}"; shift 2 ;;
    --sync-eval) sync_eval=1; shift ;;
    --async-rules)
      [[ ${2:-} =~ ^[0-9]+:[0-9.]+:[0-9.]+:[0-9]+:[0-9]+(:cgad)?$ ]] ||
        die "--async-rules takes QUORUM:GRACE_MIN_S:GRACE_MAX_S:MAX_STALENESS:DN_PERIOD[:cgad], e.g. 1:0:5:8:0"
      async_rules=$2; shift 2 ;;
    --async-set)
      [[ ${2:-} =~ ^[a-z_]+=[0-9.]+$ ]] || die "--async-set takes KEY=NUMBER, e.g. rebase_steps=0"
      async_more+="${2/=/ = }"$'\n'; shift 2 ;;
    --fragments) fragments=${2:?}; shift 2 ;;
    --tau) tau=${2:?}; shift 2 ;;
    --alpha) alpha=${2:?}; shift 2 ;;
    --csv) csv=${2:?}; shift 2 ;;
    --keep) keep=1; shift ;;
    --loopback) loopback=1; shift ;;
    --device) device=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
done
isint() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ]; }
{ isint "$rounds" && [ "$rounds" -ge 2 ]; } || die "--rounds must be an integer ≥ 2 (round 1 is the warm-up)"
isint "$inner" || die "--inner-steps must be a positive integer"
isint "$eval_batches" || die "--eval-batches must be a positive integer"
isint "$batch" || die "--batch must be a positive integer"
isint "$seq_len" || die "--seq-len must be a positive integer"
[[ $rate == auto || $rate =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || die "--rate must be auto or like 40mbit"
IFS=, read -r -a dts <<<"${dtypes:-$dtype}"
[ ${#dts[@]} -ge 1 ] || die "--dtypes is empty"
for d in "${dts[@]}"; do
  case "$d" in fp32 | fp16 | bf16 | int8 | sparse) ;; *) die "dtype '$d': must be fp32, fp16, bf16, int8 or sparse" ;; esac
done
dtype=${dts[0]}
[[ $density =~ ^0?\.[0-9]+$ ]] || die "--density must be a number in (0, 1), e.g. 0.0156"
case "$value_bits" in 2 | 4) ;; *) die "--value-bits must be 2 or 4" ;; esac
{ [[ $inner_lr =~ ^[0-9]*\.?[0-9]+([eE]-?[0-9]+)?$ ]] && awk -v x="$inner_lr" 'BEGIN { exit !(x > 0 && x <= 10) }'; } ||
  die "--inner-lr must be a number in (0, 10], e.g. 2e-3 (as train.lr)"
[[ $outer_lr =~ ^[0-9]*\.?[0-9]+$ && $outer_momentum =~ ^-?[0-9]*\.?[0-9]+$ ]] || die "--outer-lr/--outer-momentum must be numbers"
isint "$fragments" || die "--fragments must be a positive integer"
[ $((inner % fragments)) -eq 0 ] || die "--inner-steps must be a multiple of --fragments"
[ "$tau" != auto ] || tau=$((3 * inner / fragments / 4))
[[ $tau =~ ^[0-9]+$ ]] && [ "$tau" -lt $((inner / fragments)) ] || die "--tau must be auto or an integer below H/P"
[[ $alpha =~ ^[0-9]*\.?[0-9]+$ ]] || die "--alpha must be a number in [0, 1]"
[ -z "$target" ] || [[ $target =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--target must be a number"
[[ $target_factor =~ ^[0-9]*\.?[0-9]+$ ]] || die "--target-factor must be a number, e.g. 1.02"
IFS=, read -r -a pols <<<"$policies"
[ ${#pols[@]} -ge 1 ] || die "--policies is empty"
for p in "${pols[@]}"; do [[ $p =~ ^[a-z_]+(\+dylu)?$ ]] || die "bad policy name '$p'"; done
[[ " ${pols[*]} " != *" async "* ]] || [[ " ${pols[*]} " != *"+dylu"* ]] ||
  die "async runs without adaptive steps (diloco.adaptive_steps); drop +dylu from the async policies"
[[ $pace =~ ^[0-9]*\.?[0-9]+$ ]] || die "--pace must be a number of seconds (0: off)"
[[ $seed =~ ^[0-9]+$ ]] || die "--seed must be a non-negative integer"
isint "$nodes" && [ "$nodes" -ge 2 ] || die "--nodes must be an integer ≥ 2"
IFS=, read -r -a node_speeds <<<"${speeds:-$(printf '1%.0s,' $(seq "$nodes") | sed 's/,$//')}"
for v in "${node_speeds[@]}"; do
  [[ $v =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v x="$v" 'BEGIN { exit !(x > 0 && x <= 1000) }' ||
    die "--speeds: '$v' is not a speed in (0, 1000]"
done
[ ${#node_speeds[@]} -ge 2 ] || die "--speeds needs at least 2 nodes"
[ -z "$speeds" ] || awk -v x="$pace" 'BEGIN { exit !(x > 0) }' || die "--speeds needs --pace S (the step time of speed 1)"

n=${#node_speeds[@]}
export LONGWAVE_WAN_PREFIX=lwovl$$
[[ $device =~ ^(cpu|cuda|cuda:[0-9]+|auto)$ ]] || die "--device must be cpu, cuda, cuda:N or auto"
isint "$threads" || die "--threads must be a positive integer"
if [ "$loopback" = 0 ] && ! scripts/wan check; then
  echo "overlap: cannot create network namespaces here (needs root, iproute2 and tc); nothing was measured" >&2
  exit 3
fi

# ---- the binary ------------------------------------------------------------------------------------------
bin=${LW_BINARY:-build/release/longwave}
building() { pgrep -f -- "--preset release" >/dev/null 2>&1 || pgrep -f "build/release/.*(gmake|ninja)" >/dev/null 2>&1; }
if [ -z "${LW_BINARY:-}" ]; then
  waited=0
  while building && [ $waited -lt 1200 ]; do
    [ $waited -eq 0 ] && echo "overlap: the release build is running (someone else's); waiting for it"
    sleep 5
    waited=$((waited + 5))
  done
  if [ ! -x "$bin" ]; then
    echo "overlap: $bin missing; building it"
    cmake --build --preset release --target longwave >/dev/null
  fi
fi
[ -x "$bin" ] || { echo "overlap: $bin not found or not executable" >&2; exit 2; }

work=$(mktemp -d /tmp/longwave-overlap.XXXXXX)
pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  [ "$loopback" = 1 ] || scripts/wan down "$LONGWAVE_WAN_PREFIX" >/dev/null 2>&1 || true
  if [ "$keep" = 1 ] || [ "$rc" -ne 0 ]; then
    echo "overlap: work directory kept: $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$bin" "$work/longwave"
cp "$(dirname "$bin")/longwave-torch" "$work/longwave-torch"  # run and node: longwave execs it
lw="$work/longwave"

# ---- one cluster run -------------------------------------------------------------------------------------
addr() { if [ "$loopback" = 1 ]; then echo 127.0.0.1; else echo "10.213.0.$((10 + $1))"; fi; }
# Ports: one host each in namespaces; on loopback a block of this script's own (the coordinator, then a node each).
port_base=$([ "$loopback" = 1 ] && echo $((20000 + $$ % 20000)) || echo 5600)
node_port() { if [ "$loopback" = 1 ]; then echo $((port_base + 1 + $1)); else echo 5601; fi; }

# write_cluster FILE OUT_DIR POLICY ROUNDS EVAL_EVERY EVAL_BATCHES DTYPE
write_cluster() {
  local f=$1 out=$2 policy=$3 r=$4 every=$5 eb=$6 dt=$7 i
  local o=${policy_outer[$policy]:-$outer_lr:$outer_momentum}
  # dylu: sync with adaptive steps; P+dylu: P with them (each takes P's outer setting unless it has its own).
  local outer=${policy%+dylu} adaptive=false
  [ "$outer" != dylu ] || outer=sync
  [ "$outer" = "$policy" ] || { adaptive=true; o=${policy_outer[$policy]:-${policy_outer[$outer]:-$outer_lr:$outer_momentum}}; }
  [ "$dt" != sparse ] || [ -z "$sparse_outer" ] || o=$sparse_outer
  local olr omu hb nesterov=true eval_async=true train_rounds=$r async_section=""
  IFS=: read -r olr omu hb <<<"$o"
  if [ "$outer" = async ]; then
    # The token budget of r rounds of every node's H steps ends the run; versions are not counted.
    local q gmin gmax stale dn cg
    IFS=: read -r q gmin gmax stale dn cg <<<"$async_rules"
    train_rounds=1000000
    async_section=$(printf '[async]\nquorum = %s\ngrace_min_s = %s\ngrace_max_s = %s\nmax_staleness = %s\ndn_period = %s\nage_scaling = "%s"\ntokens = %s\n' \
      "$q" "$gmin" "$gmax" "$stale" "$dn" "${cg:-none}" $((r * n * inner * batch * seq_len)))
    async_section+=$'\n'"$async_more"
  fi
  [ "$hb" != hb ] || nesterov=false
  [ "$sync_eval" = 0 ] || eval_async=false
  {
    printf '[cluster]\nid = "overlap-%s"\ncoordinator = "tcp://%s:%s"\njoin_timeout_s = 120\n' \
      "$policy" "$(addr 0)" "$port_base"
    printf 'heartbeat_timeout_s = 300\n'
    # Plain TCP, as the figures in bench/RESULTS.md (CURVE's cost: bench_allreduce --curve).
    printf '[security]\nmode = "none"\n'
    for i in $(seq 0 $((n - 1))); do
      printf '\n[[nodes]]\nname = "n%d"\nendpoint = "tcp://%s:%s"\nworkers = 1\nspeed = %s\n' "$i" "$(addr "$i")" \
        "$(node_port "$i")" "${node_speeds[$i]}"
    done
    cat <<EOF

[run]
mode = "diloco"
seed = $seed
out_dir = "$out"

[model]
preset = "$preset"
seq_len = $seq_len

[train]
inner_steps = $inner
rounds = $train_rounds
batch_size = $batch
lr = $inner_lr
warmup_steps = $inner
threads = $threads
device = "$device"
pace_step_s = $pace

[outer]
lr = $olr
momentum = $omu
nesterov = $nesterov

[diloco]
outer = "$outer"
adaptive_steps = $adaptive
fragments = $fragments
tau = $tau
alpha = $alpha

$async_section

[comm]
dtype = "$dt"
$([ "$dt" != sparse ] || printf 'density = %s\nvalue_bits = %s\n' "$density" "$value_bits")

[eval]
every_rounds = $every
batches = $eb
async = $eval_async

[checkpoint]
every_rounds = 0

[metrics]
enabled = false
EOF
  } >"$f"
}

# on_host I RATE CMD...: CMD in host I's namespace; on loopback here, the transport holding each ring link to
# RATE (bytes/s in LONGWAVE_FAULT_RING_RATE), as tbf would.
on_host() {
  local i=$1 r=$2
  shift 2
  if [ "$loopback" = 0 ]; then
    scripts/wan exec "$i" "$@"
  else
    env LONGWAVE_FAULT_RING_RATE="$(awk -v r="$r" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1)
      m = u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : 1e9; printf "%.0f", n * m / 8 }')" "$@"
  fi
}

# run_cluster NAME RATE CLUSTER_FILE TIMEOUT_S: brings the hosts up at RATE, starts the coordinator in host 0
# and node i in host i, waits; returns the first nonzero exit code (124 on timeout).
run_cluster() {
  local name=$1 r=$2 file=$3 limit=$4 i rc=0 t=0 p
  local mine=()
  if [ "$loopback" = 0 ]; then scripts/wan up $n "$r" >/dev/null || return 1; fi
  on_host 0 "$r" "$lw" coordinator "$file" >"$work/$name.coordinator.log" 2>&1 &
  mine+=($!)
  for i in $(seq 0 $((n - 1))); do
    on_host "$i" "$r" "$lw" node "$file" --node "n$i" --fresh >"$work/$name.n$i.log" 2>&1 &
    mine+=($!)
  done
  pids+=("${mine[@]}")
  # Poll; reap each process as it ends. One failing role stops the others (the coordinator would otherwise
  # wait heartbeat_timeout_s for nodes that crashed).
  local -A done_rc=()
  while [ ${#done_rc[@]} -lt ${#mine[@]} ]; do
    for p in "${mine[@]}"; do
      [ -n "${done_rc[$p]:-}" ] && continue
      kill -0 "$p" 2>/dev/null && continue
      local c=0
      wait "$p" || c=$?
      done_rc[$p]=$c
      [ $rc -eq 0 ] && [ $c -ne 0 ] && rc=$c
    done
    if [ ${#done_rc[@]} -lt ${#mine[@]} ] && { [ $rc -ne 0 ] || [ $t -ge "$limit" ]; }; then
      [ $rc -eq 0 ] && { echo "overlap: $name did not finish within $limit s; stopping its processes" >&2; rc=124; }
      for p in "${mine[@]}"; do [ -z "${done_rc[$p]:-}" ] && kill -TERM "$p" 2>/dev/null; done
      sleep 3
      for p in "${mine[@]}"; do [ -z "${done_rc[$p]:-}" ] && kill -KILL "$p" 2>/dev/null; done
      for p in "${mine[@]}"; do [ -z "${done_rc[$p]:-}" ] && { wait "$p" 2>/dev/null || true; done_rc[$p]=killed; }; done
      break
    fi
    sleep 1
    t=$((t + 1))
  done
  pids=()  # all reaped: never signal these numbers again
  [ "$loopback" = 1 ] || scripts/wan down "$LONGWAVE_WAN_PREFIX" >/dev/null 2>&1 || true
  if [ "$rc" -ne 0 ]; then
    echo "overlap: $name failed (exit $rc); last lines of its logs:" >&2
    for f in "$work/$name".*.log; do echo "--- $f" >&2; tail -5 "$f" >&2; done
  fi
  return $rc
}

# The JSON lines are flat (runtime/json/json_line.hpp), so one awk function reads a field.
awk_json='function jget(line, key,   v) {
  if (!match(line, "\"" key "\":(\"[^\"]*\"|[^,}]*)")) return "";
  v = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3); gsub(/"/, "", v); return v }'

# summarize DIR POLICY: one line of key=value from the nodes' metrics.jsonl; DIR/evals.tsv gets (seconds since the
# first node's start, round, val loss) of node n0's evaluations. allreduce_s and bytes are of the rounds'
# all-reduces only, not of those that finish the run (label above P for streaming, above 0 otherwise): eager's
# final mean of the parameters goes in fp32 whatever the dtype, and took 14 s at int8's 7 mbit.
summarize() {
  local dir=$1 maxlabel=0
  [ "$2" != streaming ] || maxlabel=$fragments
  awk -v sync_eval="$sync_eval" -v maxlabel="$maxlabel" "$awk_json"'
    FNR == 1 { node = FILENAME; sub(/\/metrics.jsonl$/, "", node); sub(/.*\//, "", node) }
    {
      kind = jget($0, "kind"); ts = jget($0, "ts") + 0
      if (kind == "start") { start[node] = ts; if (first_start == "" || ts < first_start) first_start = ts; params = jget($0, "params") }
      else if (kind == "end") { end_ts[node] = ts; if (node == "n0") final_loss = jget($0, "val_loss") }
      else if (kind == "version" && node == "n0") {
        merged = jget($0, "merged_tokens") + 0; versions++
        if (versions == 1) { v1_ts = ts; v1_merged = merged }
        vl_ts = ts
      }
      else if (kind == "worker") {
        r = jget($0, "round") + 0; c = jget($0, "compute_s"); w = jget($0, "wall_s")
        all_c += c; all_w += w; nw_lines++
        wts[node, r] = ts; wk[node, r]++
        if (r > maxr) maxr = r
        if (r >= 2) { sc += c; sw += w; stall += jget($0, "stall_s"); phase_sum += c; phase_n++
          g = jget($0, "gpu_busy_s"); if (g != "") { sg += g; gw += w }
          pk = jget($0, "gpu_memory_peak_bytes"); if (pk != "" && pk + 0 > gpeak) gpeak = pk + 0
          # Where the idle went: loading theta, making the pseudo-gradient, the gaps between steps, the boundary
          sl += jget($0, "load_s"); sd += jget($0, "delta_s"); sgap += jget($0, "gaps_s"); sb += jget($0, "boundary_s") }
      }
      else if (kind == "round" && jget($0, "round") + 0 >= 2) {
        # Where a round boundary went, as each node coordinator saw it (rounds 2..)
        rn++; rwait += jget($0, "reducing_s") + 0; rstep += jget($0, "outer_step_s") + 0
      }
      else if (kind == "eval") {
        r = jget($0, "round") + 0; ev_ts[node, r] = ts
        if (node == "n0") evals[++ne] = sprintf("%.3f %d %s", ts, r, jget($0, "val_loss"))
      }
      else if (kind == "allreduce" && jget($0, "label") + 0 <= maxlabel) {
        r = jget($0, "round") + 0; s = jget($0, "seconds") + 0
        if (s > ar[r]) ar[r] = s
        bytes = jget($0, "bytes_sent")
      }
    }
    END {
      # Synchronous evaluation after round r runs inside round r+1 wall time (its wall runs from round r end):
      # subtract it. Asynchronous evaluation is off the training path: nothing to subtract (no-eval = util).
      if (sync_eval) for (k in ev_ts) { split(k, kk, SUBSEP); r = kk[2] + 0; nd = kk[1]
        if (r >= 1 && r < maxr && ((nd, r) in wts)) eval_w += (ev_ts[k] - wts[nd, r]) * wk[nd, r] }
      nar = 0; ar_sum = 0; for (r in ar) if (r + 0 >= 2) { ar_sum += ar[r]; nar++ }
      wall = 0; for (nd in end_ts) if (end_ts[nd] - first_start > wall) wall = end_ts[nd] - first_start
      nodes = 0; for (nd in start) nodes++
      # Steady state: tokens merged between the first and the last merge (async: versions; sync: node n0
      # ending the phases of its rounds), over the seconds between, without the start and the tail of the run.
      if (versions > 1) { st_tok = merged - v1_merged; st_s = vl_ts - v1_ts; st_rounds = 0 }
      else if (("n0", 1) in wts && ("n0", maxr) in wts) { st_rounds = maxr - 1; st_s = wts["n0", maxr] - wts["n0", 1]; st_tok = 0 }
      printf "util=%.4f util_all=%.4f util_noeval=%.4f stall_s=%.2f phase_s=%.3f allreduce_s=%.3f wall_s=%.1f final_loss=%s params=%s bytes=%s nodes=%d worker_lines=%d merged_tokens=%d versions=%d steady_tokens=%d steady_rounds=%d steady_s=%.2f idle_round_s=%.3f reducing_round_s=%.3f outer_step_round_s=%.3f gpu_util=%s load_round_s=%.4f delta_round_s=%.4f gaps_round_s=%.4f boundary_round_s=%.4f gpu_peak_gib=%s\n",
        (sw > 0 ? sc / sw : 0), (all_w > 0 ? all_c / all_w : 0), ((sw - eval_w) > 0 ? sc / (sw - eval_w) : 0),
        (nodes > 0 ? stall / nodes : 0), (phase_n > 0 ? phase_sum / phase_n : 0), (nar > 0 ? ar_sum / nar : 0),
        wall, final_loss, params, bytes, nodes, nw_lines, merged, versions, st_tok, st_rounds, st_s,
        (phase_n > 0 ? (sw - sc) / phase_n : 0), (rn > 0 ? rwait / rn : 0), (rn > 0 ? rstep / rn : 0), (gw > 0 ? sprintf("%.4f", sg / gw) : "-"),
        (phase_n > 0 ? sl / phase_n : 0), (phase_n > 0 ? sd / phase_n : 0), (phase_n > 0 ? sgap / phase_n : 0), (phase_n > 0 ? sb / phase_n : 0),
        (gpeak > 0 ? sprintf("%.3f", gpeak / 1073741824) : "-")
      for (i = 1; i <= ne; ++i) { split(evals[i], e, " "); printf "%.3f\t%d\t%s\n", e[1] - first_start, e[2], e[3] > (DIR "/evals.tsv") }
    }' DIR="$dir" "$dir"/n*/metrics.jsonl
}
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }

echo "overlap: $n $([ "$loopback" = 1 ] && echo "nodes on loopback (the transport's rate limit)" || echo "hosts (scripts/wan, prefix $LONGWAVE_WAN_PREFIX)"), 1 worker each on $device, threads=$threads, $preset model,"
overrides=""; for k in "${!policy_outer[@]}"; do overrides+=" $k=${policy_outer[$k]}"; done
echo "         batch $batch x $seq_len, H=$inner, inner lr $inner_lr, $rounds rounds$(for d in "${!dtype_rounds[@]}"; do printf ' (%s: %s)' "$d" "${dtype_rounds[$d]}"; done), dtypes ${dts[*]}$([[ " ${dts[*]} " != *" sparse "* ]] || echo " (sparse density $density, $value_bits bits)"), eval every round ($eval_batches batches, $([ "$sync_eval" = 1 ] && echo "on the training path" || echo "async")),"
echo "         outer lr $outer_lr momentum $outer_momentum${overrides:+ (lr:momentum per policy:$overrides)}"
echo "         binary $bin, policies ${pols[*]} (streaming: P=$fragments, tau=$tau, alpha=$alpha); the machine is shared, so absolute times are noise, ratios hold"

# ---- 1. calibration: the inner phase time under the same 4-process load ----------------------------------
# With the runs' evaluation after every round: it runs off the training path, so it slows the next phase
# (session 10 calibrated without it: a 6.88-6.91 s phase, against 7.08-7.20 s in sync's own run).
if [ "$rate" = auto ]; then
  cal_rounds=3
  mkdir -p "$work/cal"
  write_cluster "$work/cal.toml" "$work/cal" sync $cal_rounds 1 "$eval_batches" "$dtype"
  echo "calibrating: sync, $cal_rounds rounds at 1gbit (the all-reduce is short next to the inner phase there, so the rounds measure compute, evaluation included)"
  run_cluster cal 1gbit "$work/cal.toml" 900 || exit 1
  cal=$(summarize "$work/cal" sync)
  phase=$(field phase_s "$cal")
  params=$(field params "$cal")
  case "$dtype" in fp32) bpe=4 ;; fp16 | bf16) bpe=2 ;; int8) bpe=1 ;; *) die "--rate auto calibrates for a dense dtype: put one first in --dtypes" ;; esac
  # Ring: each node sends 2(N-1)/N of the model per round (int8 adds a small per-chunk header, ignored here).
  rate_mbit=$(awk -v n=$n -v p="$params" -v b="$bpe" -v ph="$phase" -v ra="$ratio" -v e="$efficiency" \
    'BEGIN { bytes = 2 * (n - 1) / n * b * p; m = bytes * 8 / (ra * ph * e) / 1e6; printf "%d", (m < 1 ? 1 : m + 0.5) }')
  rate="${rate_mbit}mbit"
  awk -v n=$n -v p="$params" -v b="$bpe" -v ph="$phase" -v ra="$ratio" -v e="$efficiency" -v h="$inner" -v r="$rate_mbit" 'BEGIN {
    bytes = 2 * (n - 1) / n * b * p
    printf "calibrated: inner phase %.2f s (%d steps x %.3f s, mean over workers and rounds 2..); %d params x %d B\n", ph, h, ph / h, p, b
    printf "            -> %.2f MB sent per node per all-reduce; for %.2f s (= %.2f x phase) at %.0f%% link efficiency: %d mbit\n",
      bytes / 1e6, ra * ph, ra, e * 100, r }'
else
  echo "rate: $rate (given)"
fi

# ---- 2. one run per policy and dtype --------------------------------------------------------------------
runs=()
declare -A run_policy run_dtype summary
for d in "${dts[@]}"; do
  for p in "${pols[@]}"; do
    id=$p
    [ ${#dts[@]} -eq 1 ] || id="$p-$d"
    runs+=("$id"); run_policy[$id]=$p; run_dtype[$id]=$d
  done
done
run_rounds() { echo "${policy_rounds[${run_policy[$1]}]:-${dtype_rounds[${run_dtype[$1]}]:-$rounds}}"; }
failed=0
for id in "${runs[@]}"; do
  p=${run_policy[$id]}
  mkdir -p "$work/$id"
  write_cluster "$work/$id.toml" "$work/$id" "$p" "$(run_rounds "$id")" 1 "$eval_batches" "${run_dtype[$id]}"
  echo "running $id: $(run_rounds "$id") rounds at $rate, ${run_dtype[$id]} on the wire ..."
  t0=$(date +%s)
  if run_cluster "$id" "$rate" "$work/$id.toml" 3600; then
    summary[$id]=$(summarize "$work/$id" "$p")
    echo "  done in $(($(date +%s) - t0)) s: ${summary[$id]}"
    grep -h "later than needed" "$work/$id".n*.log | head -3 | sed 's/^/  log: /' || true
  else
    failed=1
  fi
done

# ---- 3. report -------------------------------------------------------------------------------------------
# The baseline: sync with the first dtype.
base=""
for id in "${runs[@]}"; do
  [ "${run_policy[$id]}" = sync ] && [ "${run_dtype[$id]}" = "$dtype" ] && [ -n "${summary[$id]:-}" ] && base=$id
done
if [ -z "$target" ]; then
  ref=${base:-}
  if [ -z "$ref" ]; then for id in "${runs[@]}"; do [ -n "${summary[$id]:-}" ] && ref=$id && break; done; fi
  [ -n "$ref" ] || { echo "overlap: no policy finished" >&2; exit 1; }
  target=$(awk -v l="$(field final_loss "${summary[$ref]}")" -v f="$target_factor" 'BEGIN { printf "%.9g", l * f }')
  target_why="$ref's final val loss x $target_factor"
else
  target_why="given"
fi
# ttt DIR: "INTERP FIRST" for node n0's val loss reaching the target: FIRST is the time (s since start) of the
# first evaluation at or below it; INTERP interpolates linearly between that evaluation and the one before,
# so that the estimate does not move in steps of a whole round. "- -" if never reached.
ttt() {
  awk -v t="$target" '
    $3 + 0 <= t + 0 {
      x = $1
      if (seen && pl > $3 + 0) x = pt + (pl - t) / (pl - $3) * ($1 - pt)
      printf "%.1f %.1f", x, $1; found = 1; exit
    }
    { pt = $1; pl = $3 + 0; seen = 1 }
    END { if (!found) printf "- -" }' "$1/evals.tsv"
}
mkdir -p "$(dirname "$csv")"
echo "policy,rounds,inner_steps,inner_lr,rate,dtype,utilization,utilization_all_rounds,utilization_no_eval,stall_s_per_worker,phase_s,allreduce_s,allreduce_over_phase,wall_s,final_val_loss,target_val_loss,time_to_target_s,time_to_first_eval_at_target_s,utilization_vs_sync,speedup_to_target_vs_sync,bytes_sent_per_node,speedup_to_target_vs_int8,gpu_utilization,load_round_s,delta_round_s,gaps_round_s,boundary_round_s,gpu_peak_gib" >"$csv"
base_util=""; base_ttt=""
if [ -n "$base" ]; then base_util=$(field util "${summary[$base]}"); read -r base_ttt _ <<<"$(ttt "$work/$base")"; fi
# int8_ttt POLICY: the time to target of POLICY's int8 run, when there is one and it reached the target.
int8_ttt() {
  local id
  for id in "${runs[@]}"; do
    if [ "${run_policy[$id]}" = "$1" ] && [ "${run_dtype[$id]}" = int8 ] && [ -n "${summary[$id]:-}" ]; then
      ttt "$work/$id" | cut -d' ' -f1
      return
    fi
  done
  echo "-"
}
echo
echo "overlap: $n nodes x 1 worker, $preset, batch $batch x $seq_len, H=$inner, inner lr $inner_lr, $rounds rounds, link $rate, $dtype on the wire"
echo "target val loss $target ($target_why); utilization over rounds 2..$rounds (all: rounds 1..$rounds; no-eval: evaluation time removed)"
printf "%-16s %6s %6s %7s %8s %7s %7s %6s %7s %8s %9s %9s %7s %8s %9s\n" run util all no-eval stall_s phase_s ar_s ar/ph wall_s final to_target 1st_eval util/s speedup vs_int8
for id in "${runs[@]}"; do
  s=${summary[$id]:-}
  p=${run_policy[$id]}; d=${run_dtype[$id]}
  if [ -z "$s" ]; then
    printf "%-16s %s\n" "$id" "failed (see the log tails above)"
    echo "$p,$(run_rounds "$id"),$inner,$inner_lr,$rate,$d,,,,,,,,,,$target,,,,,,,,,,,," >>"$csv"
    continue
  fi
  u=$(field util "$s"); read -r tt tf <<<"$(ttt "$work/$id")"
  row=$(awk -v u="$u" -v bu="$base_util" -v tt="$tt" -v bt="$base_ttt" -v ph="$(field phase_s "$s")" \
    -v ar="$(field allreduce_s "$s")" -v it="$(int8_ttt "$p")" 'BEGIN {
      ur = bu != "" && bu > 0 ? sprintf("%.3f", u / bu) : "-"
      sp = (bt != "" && bt != "-" && tt != "-" && tt > 0) ? sprintf("%.3f", bt / tt) : "-"
      vi = (it != "-" && tt != "-" && tt > 0) ? sprintf("%.3f", it / tt) : "-"
      printf "%.3f %s %s %s", (ph > 0 ? ar / ph : 0), ur, sp, vi }')
  read -r arph ur sp vi <<<"$row"
  printf "%-16s %6.3f %6.3f %7.3f %8.2f %7.2f %7.2f %6.2f %7.1f %8.4f %9s %9s %7s %8s %9s\n" "$id" "$u" \
    "$(field util_all "$s")" "$(field util_noeval "$s")" "$(field stall_s "$s")" "$(field phase_s "$s")" \
    "$(field allreduce_s "$s")" "$arph" "$(field wall_s "$s")" "$(field final_loss "$s")" "$tt" "$tf" "$ur" "$sp" "$vi"
  echo "$p,$(run_rounds "$id"),$inner,$inner_lr,$rate,$d,$u,$(field util_all "$s"),$(field util_noeval "$s"),$(field stall_s "$s"),$(field phase_s "$s"),$(field allreduce_s "$s"),$arph,$(field wall_s "$s"),$(field final_loss "$s"),$target,$tt,$tf,$ur,$sp,$(field bytes "$s"),$vi,$(field gpu_util "$s"),$(field load_round_s "$s"),$(field delta_round_s "$s"),$(field gaps_round_s "$s"),$(field boundary_round_s "$s"),$(field gpu_peak_gib "$s")" >>"$csv"
done
echo
echo "util = Σ compute_s ÷ Σ wall_s (goal ≥ 0.97 for overlap policies, sync expected near 0.67); a GPU worker's"
echo "compute_s is the host's time until its step is done; the CSV's gpu_utilization is the same from CUDA events"
echo "(Σ gpu_busy_s ÷ Σ wall_s); its idle a round splits into the CSV's load (theta onto the device), delta (the"
echo "pseudo-gradient made), gaps (between steps) and boundary (no round running on the worker), gpu_peak_gib the"
echo "largest device memory peak a GPU worker reported (rounds 2..); ar/ph = all-reduce time (slowest node, mean of"
echo "rounds 2..) ÷ inner phase; to_target = s from start until node n0's val loss ≤ target,"
echo "interpolated linearly between the evaluation before and the first at or below it (1st_eval: that evaluation's"
echo "time); util/s and speedup are ratios against ${base:-sync} measured in this run (speedup = its to_target ÷ this"
echo "one's); vs_int8 = to_target of the same policy with int8 ÷ this one's."
# A2 (issue 39): goodput = merged tokens per second ÷ what the same paced nodes train per second alone (every
# node's speed / pace steps a second, batch x seq_len tokens a step); sync merges every token it trains. Over
# the whole wall time, and in the steady state between the first and the last merge.
if awk -v p="$pace" 'BEGIN { exit !(p > 0) }'; then
  alone=$(printf '%s\n' "${node_speeds[@]}" | awk -v b="$batch" -v t="$seq_len" -v p="$pace" '{ s += $1 } END { printf "%.1f", s * b * t / p }')
  for id in "${runs[@]}"; do
    s=${summary[$id]:-}
    [ -n "$s" ] || continue
    merged=$(field merged_tokens "$s")
    [ "${run_policy[$id]}" != sync ] || merged=$(($(run_rounds "$id") * n * inner * batch * seq_len))
    [ "$merged" -gt 0 ] 2>/dev/null || continue
    steady_tok=$(field steady_tokens "$s")
    [ "$(field steady_rounds "$s")" = 0 ] || steady_tok=$(($(field steady_rounds "$s") * n * inner * batch * seq_len))
    awk -v id="$id" -v m="$merged" -v w="$(field wall_s "$s")" -v a="$alone" -v v="$(field versions "$s")" \
      -v st="$steady_tok" -v ss="$(field steady_s "$s")" 'BEGIN {
      printf "goodput %-10s %.3f  (%d tokens merged in %.1f s%s; the nodes alone train %.0f tokens/s)", id, m / w / a, m, w,
        (v > 0 ? sprintf(", %d versions", v) : ""), a
      if (st > 0 && ss > 0) printf "; steady %.3f (%d tokens in %.1f s between the first and the last merge)", st / ss / a, st, ss
      printf "\n" }'
  done
fi
echo "csv: $csv"
exit $failed
