# shellcheck shell=bash
# Shared by the benches (the loopback cluster ones, bench/elastic_*.sh, and the link-rate ones); sourced,
# not run.
#   lw_default_binary          the newer of build/ci/longwave and build/release/longwave
#   lw_work_dir NAME           makes a directory under /tmp and, on exit, SIGKILLs the processes this
#                              shell started that still run (jobs -p: by PID, never reused ones) and removes
#                              the directory, unless lw_keep=1 (then it says where it is)
#   lw_free_port               a free loopback TCP port
#   lw_rate_gbit RATE          a tc rate ending in gbit or mbit, in Gbit/s (exit 2 naming it otherwise)
#   lw_cluster_toml DIR ID [options]   writes DIR/cluster.toml: 3 loopback nodes n0..n2 of 1 worker each,
#                              tiny model (seq_len 64), batch 4, 1 torch thread, plain TCP, no eval or metrics

lw_keep=0

lw_default_binary() {
  local b=build/ci/longwave
  [ build/release/longwave -nt "$b" ] && b=build/release/longwave
  echo "$b"
}

lw_work_dir() {  # $1: a name for the directory; sets lw_dir
  lw_dir=$(mktemp -d "/tmp/lw-$1.XXXXXX")
  trap lw_cleanup EXIT
}

# shellcheck disable=SC2317  # called by the EXIT trap
lw_cleanup() {
  local p
  for p in $(jobs -p); do kill -9 "$p" 2>/dev/null || true; done
  if [ "$lw_keep" = 1 ]; then echo "kept $lw_dir"; else rm -rf "$lw_dir"; fi
}

lw_rate_gbit() {
  case "$1" in
    *gbit) echo "${1%gbit}" ;;
    *mbit) awk "BEGIN{print ${1%mbit}/1000}" ;;
    *) echo "RATE must end in gbit or mbit, not '$1'" >&2; exit 2 ;;
  esac
}

lw_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Options: --inner-steps H (40), --rounds N (10), --cluster 'key = value' (a line for [cluster]; repeatable),
# --model 'key = value' (a line for [model]; repeatable), --checkpoint-every N (1), --checkpoint-keep K.
lw_cluster_toml() {
  local d=$1 id=$2 inner=40 rounds=10 every=1 keep_ckpt="" cluster_lines="" model_lines=""
  shift 2
  while [ $# -gt 0 ]; do
    case "$1" in
      --inner-steps) inner=$2 ;;
      --rounds) rounds=$2 ;;
      --cluster) cluster_lines+="$2"$'\n' ;;
      --model) model_lines+="$2"$'\n' ;;
      --checkpoint-every) every=$2 ;;
      --checkpoint-keep) keep_ckpt="keep = $2"$'\n' ;;
      *) echo "lw_cluster_toml: unknown option '$1'" >&2; return 2 ;;
    esac
    shift 2
  done
  {
    printf '[cluster]\nid = "%s"\ncoordinator = "tcp://127.0.0.1:%s"\n%s' "$id" "$(lw_free_port)" "$cluster_lines"
    # Plain TCP, as the figures in bench/RESULTS.md (CURVE's cost: bench_allreduce --curve).
    printf '[security]\nmode = "none"\n'
    local n
    for n in n0 n1 n2; do
      printf '[[nodes]]\nname = "%s"\nendpoint = "tcp://127.0.0.1:%s"\nworkers = 1\n' "$n" "$(lw_free_port)"
    done
    printf '[run]\nout_dir = "%s/run"\nseed = 7\n[model]\nseq_len = 64\n%s' "$d" "$model_lines"
    printf '[train]\ninner_steps = %s\nrounds = %s\nbatch_size = 4\nwarmup_steps = 3\nthreads = 1\n' "$inner" "$rounds"
    printf '[eval]\nevery_rounds = 0\n[checkpoint]\nevery_rounds = %s\n%s[metrics]\nenabled = false\n' "$every" "$keep_ckpt"
  } >"$d/cluster.toml"
}
