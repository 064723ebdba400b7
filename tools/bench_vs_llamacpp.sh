#!/usr/bin/env bash
# sluice beside llama.cpp on the same GGUF files, interleaved, 2 threads.
#
# Usage: tools/bench_vs_llamacpp.sh LLAMA_CPP_BIN_DIR OUT_DIR FILE.gguf...
#
# Per file, in this order: llama-bench (pp512 and tg128, 3 repetitions,
# JSON), llama-batched-bench (prompt P -> 128 new tokens at 1, 8 and 32
# sequences, for each P in $PROMPTS, default "128 512", its context sized
# to 32 such sequences), then `sluice bench-model --model FILE`: prompt 512
# for the prefill figure, and prompt P -> 128 at 1, 8 and 32 requests for
# decode (medians of 3) for each P. llama.cpp's peak RSS is /usr/bin/time
# -v's; sluice's is its own VmHWM, read before it allocates the buffer of
# its bandwidth measurement. Each run first waits (up to 5 minutes) until no other
# process uses more than 20% of a CPU, and logs the load. The last lines
# are a Markdown table: sluice / llama.cpp per figure (llama.cpp's decode
# at 1 request is the better of its two tools).
# Build sluice first (`cargo build --release`); llama.cpp's tools come from
# its own cmake build (`llama-bench`, `llama-batched-bench`).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,18p "$0"; exit 2; }
bin=$1 out=$2; shift 2
sluice=${SLUICE:-target/release/sluice}
prompts=${PROMPTS:-128 512}
mkdir -p "$out"
quiet() {
  for _ in $(seq 1 60); do
    busy=$(ps -eo pcpu=,pid=,comm= | awk -v me=$$ '$1>20 && $2!=me {print $3"("$1")"}' | tr '\n' ' ')
    [ -z "$busy" ] && break
    sleep 5
  done
  echo "   load $(cut -d' ' -f1-3 /proc/loadavg) ${busy:+(busy: $busy)}"
}
rss() { awk '/Maximum resident/ {printf "%.0f", $NF/1024}' "$1"; }
names=()
for f in "$@"; do
  n=$(basename "$f" .gguf)
  names+=("$n")
  echo "== $n"
  quiet
  /usr/bin/time -v "$bin/llama-bench" -m "$f" -t 2 -p 512 -n 128 -r 3 -o json \
    > "$out/$n.llama-bench.json" 2> "$out/$n.llama-bench.err"
  rss "$out/$n.llama-bench.err" > "$out/$n.llama-bench.rss"
  quiet
  for p in $prompts; do
    c=$(( (p + 128) * 32 < 8192 ? 8192 : (p + 128) * 32 ))
    /usr/bin/time -v "$bin/llama-batched-bench" -m "$f" -t 2 -c $c -b 2048 -ub 512 \
      -npp $p -ntg 128 -npl 1,8,32 > "$out/$n.batched$p.txt" 2> "$out/$n.batched$p.err"
    grep -hE "^\|" "$out/$n.batched$p.txt" "$out/$n.batched$p.err" > "$out/$n.batched$p.table" || true
    rss "$out/$n.batched$p.err" > "$out/$n.batched$p.rss"
    quiet
  done
  # The table goes to stderr, the JSON object is stdout's last line.
  "$sluice" bench-model --model "$f" --threads 2 --prompt-len 512 --output-len 2 \
    --concurrency 1 --repeats 3 > "$out/$n.sluice-pp.txt" 2> "$out/$n.sluice-pp.err"
  tail -n 1 "$out/$n.sluice-pp.txt" > "$out/$n.sluice-pp.json"
  for p in $prompts; do
    quiet
    "$sluice" bench-model --model "$f" --threads 2 --prompt-len $p --output-len 128 \
      --concurrency 1,8,32 --repeats 3 > "$out/$n.sluice$p.txt" 2> "$out/$n.sluice$p.err"
    tail -n 1 "$out/$n.sluice$p.txt" > "$out/$n.sluice$p.json"
  done
done
python3 - "$out" "$prompts" "${names[@]}" <<'PY'
import json, re, statistics, sys
out, prompts, names = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
first = prompts[0]
def batched(path):
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    rows = {}
    for line in open(path):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) >= 10 and c[2].isdigit():
            rows[int(c[2])] = float(c[7])
    return rows
print(f"| file | prefill, 512 | decode, 1 request | aggregate decode, 32 requests | 1-request decode ÷ bound | peak RSS MiB (sluice / llama-bench / batched-bench), prompt {first} |")
print("|---|---|---|---|---|---|")
for n in names:
    lb = json.load(open(f"{out}/{n}.llama-bench.json"))
    pp = next(statistics.median(r["samples_ts"]) for r in lb if r["n_prompt"])
    tg = next(statistics.median(r["samples_ts"]) for r in lb if r["n_gen"])
    bb = batched(f"{out}/{n}.batched{first}.table")
    tg1 = max(tg, bb.get(1, 0.0))
    spp = json.load(open(f"{out}/{n}.sluice-pp.json"))
    s = json.load(open(f"{out}/{n}.sluice{first}.json"))
    d1, d32 = s["decode_tok_s"]["1"], s["decode_tok_s"]["32"]
    rss_l = open(f"{out}/{n}.llama-bench.rss").read().strip()
    rss_b = open(f"{out}/{n}.batched{first}.rss").read().strip()
    print(f"| {n} | {spp['prefill_tok_s']:,.0f} / {pp:,.0f} = {spp['prefill_tok_s']/pp:.2f}× "
          f"| {d1:.1f} / {tg1:.1f} = {d1/tg1:.2f}× "
          f"| {d32:.1f} / {bb.get(32, float('nan')):.1f} = {d32/bb.get(32, float('nan')):.2f}× "
          f"| {s['decode_1_fraction_of_bandwidth_bound']:.2f} "
          f"| {s['peak_rss_bytes']/2**20:.0f} / {rss_l} / {rss_b} |")
# Decode after each prompt length, at 1, 8 and 32 requests (llama.cpp:
# batched-bench's S_TG), and the peak RSS of the two runs at that context.
print()
print("| file | prompt | decode, 1 request | 8 requests | 32 requests | peak RSS MiB (sluice / batched-bench) |")
print("|---|---|---|---|---|---|")
for n in names:
    for p in prompts:
        bb = batched(f"{out}/{n}.batched{p}.table")
        s = json.load(open(f"{out}/{n}.sluice{p}.json"))
        cells = []
        for k in (1, 8, 32):
            a, b = s["decode_tok_s"][str(k)], bb.get(k, float("nan"))
            cells.append(f"{a:.1f} / {b:.1f} = {a/b:.2f}×")
        rss_b = open(f"{out}/{n}.batched{p}.rss").read().strip()
        print(f"| {n} | {p} | " + " | ".join(cells) + f" | {s['peak_rss_bytes']/2**20:.0f} / {rss_b} |")
PY
