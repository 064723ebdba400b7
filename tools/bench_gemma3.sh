#!/usr/bin/env bash
# Gemma 3 (sliding-window and full layers) beside llama.cpp on the same GGUF
# file, interleaved, 2 threads: decode at 1 and 32 requests and prefill, at
# prompt 128 and at prompt 4,096 (where the 512-token window matters), and
# the KV cache one sequence holds at 4,096 tokens (llama.cpp's own report
# with its default SWA cache, `--swa-full` off; sluice with the hybrid KV
# cache manager and with it off).
#
# Usage: tools/bench_gemma3.sh LLAMA_CPP_BIN_DIR OUT_DIR FILE.gguf
#
# llama.cpp: llama-bench (pp and tg, 3 repetitions) and llama-batched-bench
# (npp -> ntg at 1 and 32 sequences, flash attention as it chooses);
# sluice: `bench-model` (medians of 3; 1 at prompt 4,096 and 32 requests).
# Each run first waits (up to 5 minutes) until no other process uses more
# than 20% of a CPU, and logs the load. Build sluice first (`cargo build
# --release`).
set -euo pipefail
[ $# -eq 3 ] || { sed -n 2,17p "$0"; exit 2; }
bin=$1 out=$2 f=$3
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
grep -m1 "model name" /proc/cpuinfo | sed 's/^/cpu: /'
echo "cpu flags: $(grep -o 'avx512_vnni\|avx512_bf16\|avx_vnni\|avx512f\|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for case in "128 128 3" "4096 32 1"; do
  set -- $case
  pp=$1 tg=$2 reps=$3
  echo "== prompt $pp -> $tg"
  quiet
  "$bin/llama-bench" -m "$f" -t 2 -p "$pp" -n "$tg" -r 3 -o json \
    > "$out/llama-bench-$pp.json" 2> "$out/llama-bench-$pp.err"
  python3 - "$out/llama-bench-$pp.json" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1])):
    t = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print(f"   llama-bench {t}: median {statistics.median(r['samples_ts']):.1f} tok/s")
PY
  quiet
  "$sluice" bench-model --model "$f" --threads 2 --prompt-len "$pp" --output-len "$tg" \
    --concurrency 1 --repeats 3 > "$out/sluice-$pp-1.json" 2> "$out/sluice-$pp-1.err"
  grep -E "prefill|decode tok|KV MiB" "$out/sluice-$pp-1.err" | sed 's/^/   sluice /'
  quiet
  ctx=$((32 * (pp + tg) + 256))
  "$bin/llama-batched-bench" -m "$f" -t 2 -c "$ctx" -b 2048 -ub 512 \
    -npp "$pp" -ntg "$tg" -npl 1,32 > "$out/batched-$pp.txt" 2> "$out/batched-$pp.err"
  grep -hE "^\|" "$out/batched-$pp.txt" "$out/batched-$pp.err" | sed 's/^/   /'
  quiet
  "$sluice" bench-model --model "$f" --threads 2 --prompt-len "$pp" --output-len "$tg" \
    --concurrency 32 --repeats "$reps" > "$out/sluice-$pp-32.json" 2> "$out/sluice-$pp-32.err"
  grep -E "decode tok|output tok" "$out/sluice-$pp-32.err" | sed 's/^/   sluice /'
done
echo "== KV cache of one sequence at 4,096 + 32 tokens"
quiet
"$bin/llama-batched-bench" -m "$f" -t 2 -c 4128 -b 2048 -ub 512 -npp 4096 -ntg 32 -npl 1 \
  > "$out/kv-llama.txt" 2> "$out/kv-llama.err"
grep -E "llama_kv_cache.*(size|cells)|swa" "$out/kv-llama.err" | sed 's/^/   llama.cpp /' || true
"$sluice" bench-model --model "$f" --threads 2 --prompt-len 4096 --output-len 32 \
  --concurrency 1 --repeats 1 --disable-hybrid-kv-cache-manager \
  > "$out/kv-sluice-off.json" 2> "$out/kv-sluice-off.err"
grep -E "KV MiB|groups" "$out/sluice-4096-1.err" | sed 's/^/   sluice hybrid /'
grep -E "KV MiB|groups" "$out/kv-sluice-off.err" | sed 's/^/   sluice hybrid off /'
