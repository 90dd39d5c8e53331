#!/usr/bin/env bash
# longwave report's peak memory against the size of the metrics.jsonl it reads (issue 37, item 8): writes a
# synthetic run of ROUNDS rounds x H inner steps x 4 workers (about 12.6 kB a round at H = 100) and prints the
# report's peak RSS ÷ the file's size and its wall time. A small H (ddp: 1) makes the file mostly worker and
# all-reduce records, which the report keeps.
# usage: bench/report_memory.sh [ROUNDS] [H]   (defaults 20000 and 100)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20000}
h=${2:-100}
bin=build/ci/longwave
[ -x "$bin" ] || { echo "report_memory: $bin is missing: cmake --build --preset ci" >&2; exit 2; }
dir=$(mktemp -d /tmp/lw-report-memory.XXXXXX)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/metrics.jsonl" "$rounds" "$h" <<'PY'
import sys
path, rounds, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    t = 1.7e9
    f.write('{"kind":"start","ts":%.3f,"node":"bench","mode":"diloco","preset":"tiny","params":1820000,"workers":4,'
            '"rounds":%d,"inner_steps":%d,"batch_size":8,"seq_len":64,"inner_lr":0.004,"outer_lr":0.7,'
            '"outer_momentum":0.9,"comm_dtype":"fp32","resumed_step":0}\n' % (t, rounds, h))
    step = 0
    for r in range(1, rounds + 1):
        for s in range(h):
            step += 1
            t += 0.01
            f.write('{"kind":"step","ts":%.3f,"step":%d,"round":%d,"loss":%.6f,"tokens_per_second":%.1f,"lr":0.004}\n'
                    % (t, step, r, 2 + 3 / (1 + 0.001 * step), 5000.0 + s))
        for w in range(4):
            f.write('{"kind":"worker","ts":%.3f,"round":%d,"worker":%d,"compute_s":1.6,"wall_s":2.0,"idle_s":0.4,'
                    '"stall_s":0.0,"utilization":0.8,"staleness":0,"tokens":%d}\n' % (t, r, w, r * 5120))
        f.write('{"kind":"allreduce","ts":%.3f,"round":%d,"label":0,"seconds":0.05,"bytes_sent":7280000,'
                '"bytes_received":7280000,"dtype":"fp32"}\n' % (t, r))
    f.write('{"kind":"end","ts":%.3f,"exit_code":0,"val_loss":2.1,"val_ppl":8.1,"seconds":100.0,"steps":%d}\n' % (t, step))
PY
bytes=$(stat -c %s "$dir/metrics.jsonl")
/usr/bin/time -f '%M %e' -o "$dir/time.txt" "$bin" report "$dir" >/dev/null 2>"$dir/err.txt" ||
  { cat "$dir/err.txt" >&2; exit 1; }
read -r rss_kb secs <"$dir/time.txt"
awk -v b="$bytes" -v k="$rss_kb" -v s="$secs" 'BEGIN {
  printf "report_memory: H = '"$h"', metrics.jsonl %.0f MB, peak RSS %.0f MB (%.2f x the file), %.1f s\n", b / 1e6, k * 1024 / 1e6, k * 1024 / b, s }'
