#!/usr/bin/env bash
# sluice beside llama.cpp on the same GGUF files, interleaved, 2 threads,
# prompt 128 -> 128 new tokens (the issue-8 figures in README.md).
#
# Usage: tools/bench_vs_llamacpp.sh LLAMA_CPP_BIN_DIR OUT_DIR FILE.gguf...
#
# Per file, in this order: llama-bench (pp128 and tg128, 3 repetitions, JSON),
# llama-batched-bench (128 -> 128 at 1, 8 and 32 sequences), then
# `sluice bench-model --model FILE` (medians of 3). llama.cpp's peak RSS is
# /usr/bin/time -v's; sluice's is its own VmHWM, read before it allocates the
# buffer of its bandwidth measurement. Each run first waits (up to 5 minutes)
# until no other process uses more than 20% of a CPU, and logs the load.
# Build sluice first (`cargo build --release`); llama.cpp's tools come from
# its own cmake build (`llama-bench`, `llama-batched-bench`).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,13p "$0"; exit 2; }
bin=$1 out=$2; shift 2
sluice=${SLUICE:-target/release/sluice}
mkdir -p "$out"
quiet() {
  for _ in $(seq 1 60); do
    busy=$(ps -eo pcpu=,pid=,comm= | awk -v me=$$ '$1>20 && $2!=me {print $3"("$1")"}' | tr '\n' ' ')
    [ -z "$busy" ] && break
    sleep 5
  done
  echo "   load $(cut -d' ' -f1-3 /proc/loadavg) ${busy:+(busy: $busy)}"
}
rss() { awk '/Maximum resident/ {printf "%.0f MiB", $NF/1024}' "$1"; }
for f in "$@"; do
  n=$(basename "$f" .gguf)
  echo "== $n"
  quiet
  /usr/bin/time -v "$bin/llama-bench" -m "$f" -t 2 -p 128 -n 128 -r 3 -o json \
    > "$out/$n.llama-bench.json" 2> "$out/$n.llama-bench.err"
  python3 - "$out/$n.llama-bench.json" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1])):
    t = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print(f"   llama-bench {t}: median {statistics.median(r['samples_ts']):.1f} tok/s")
PY
  echo "   llama-bench peak RSS $(rss "$out/$n.llama-bench.err")"
  quiet
  /usr/bin/time -v "$bin/llama-batched-bench" -m "$f" -t 2 -c 8192 -b 2048 -ub 512 \
    -npp 128 -ntg 128 -npl 1,8,32 > "$out/$n.batched.txt" 2> "$out/$n.batched.err"
  grep -hE "^\|" "$out/$n.batched.txt" "$out/$n.batched.err" | sed 's/^/   /'
  echo "   llama-batched-bench peak RSS $(rss "$out/$n.batched.err")"
  quiet
  "$sluice" bench-model --model "$f" --threads 2 \
    --concurrency 1,8,32 --repeats 3 > "$out/$n.sluice.txt" 2> "$out/$n.sluice.err"
  # The table goes to stderr, the JSON object is stdout's last line.
  grep -E "tok/s|RSS|GB/s|bound" "$out/$n.sluice.err" | sed 's/^/   sluice /' || true
  tail -n 1 "$out/$n.sluice.txt" > "$out/$n.sluice.json"
done
