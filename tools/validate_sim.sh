#!/usr/bin/env bash
# Validates `sluice simulate` against `sluice serve` on this machine: fits a
# CPU step-time profile from `sluice serve --step-log` on one workload, then
# predicts other workloads (another rate, other lengths, shared prefixes, a
# load that preempts) and compares with `sluice bench` against a fresh
# `sluice serve` on each. The simulator gets the exact requests and send
# times `sluice bench` sends (`--tokenizer`, the same seed).
#
# Usage: tools/validate_sim.sh SLUICE_BIN MODEL_DIR OUT_DIR
#   MODEL_DIR: a Hugging Face model directory with tokenizer.json, e.g. the
#   Qwen2.5-0.5B shape with random bf16 weights made by
#   `python tools/make_qwen05b.py DIR 32000`, or a directory with only that
#   shape's config.json and a tokenizer, served with LOAD_FORMAT=dummy.
# REUSE=1 keeps measurements already in OUT_DIR (reruns the rest).
# Every workload's server also writes its step log, OUT_DIR/NAME.steps.jsonl
# (the fit's is OUT_DIR/steps.jsonl): logs the profile was not fitted on,
# to check it against.
# Run it on a quiet machine: the fit and the measurements must see the same
# CPU. THREADS (default 2) is the server's model threads. Prints the table (predicted, measured, error) and writes
# OUT_DIR/validation.json.
set -euo pipefail
bin=$(realpath "$1") model=$(realpath "$2") out=$3
mkdir -p "$out"
out=$(realpath "$out")
port=${PORT:-8321}
threads=${THREADS:-2}
blocks=${BLOCKS:-2048}
common_serve=(--model "$model" --port "$port" --threads "$threads")
if [ -n "${LOAD_FORMAT:-}" ]; then common_serve+=(--load-format "$LOAD_FORMAT"); fi

# name | KV blocks | max model len | workload flags (the same for bench and
# simulate). A small cache needs a max model len it can hold.
workloads=(
  "fit|$blocks|2048|--random-input-len 256 --random-output-len 64 --random-range-ratio 0.75 --num-prompts 80 --request-rate 0.8 --seed 1"
  "rate|$blocks|2048|--random-input-len 256 --random-output-len 64 --random-range-ratio 0.75 --num-prompts 40 --request-rate 0.4 --seed 2"
  "lengths|$blocks|2048|--random-input-len 96 --random-output-len 128 --random-range-ratio 0.5 --num-prompts 40 --request-rate 0.6 --seed 3"
  "prefix|$blocks|2048|--random-prefix-len 384 --random-input-len 64 --random-output-len 48 --random-range-ratio 0.5 --num-prompts 60 --request-rate 0.8 --seed 4"
  "preempt|64|512|--random-input-len 192 --random-output-len 160 --random-range-ratio 0.25 --num-prompts 30 --request-rate 4 --seed 5"
)

wait_ready() {
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "server did not come up" >&2; return 1
}

serve_and_bench() { # name blocks maxlen flags [extra serve flags...]
  local name=$1 nblocks=$2 maxlen=$3 flags=$4; shift 4
  if [ -n "${REUSE:-}" ] && [ -s "$out/$name.measured.json" ]; then return 0; fi
  "$bin" serve "${common_serve[@]}" --num-gpu-blocks-override "$nblocks" \
    --max-model-len "$maxlen" "$@" \
    >"$out/$name.serve.log" 2>&1 &
  local pid=$!
  wait_ready
  # shellcheck disable=SC2086
  "$bin" bench --base-url "http://127.0.0.1:$port" --tokenizer "$model" \
    --dataset-name random $flags --save-result --result-dir "$out" \
    --result-filename "$name.measured.json" >"$out/$name.bench.log" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for w in "${workloads[@]}"; do
  IFS='|' read -r name nblocks maxlen flags <<<"$w"
  if [ "$name" = fit ]; then
    [ -n "${REUSE:-}" ] && [ -s "$out/fit.measured.json" ] || rm -f "$out/steps.jsonl"
    serve_and_bench "$name" "$nblocks" "$maxlen" "$flags" --step-log "$out/steps.jsonl"
    "$bin" simulate fit "$out/steps.jsonl" -o "$out/cpu-profile.json" \
      --name "$(basename "$model") on $threads threads" | tee "$out/fit.txt"
  else
    [ -n "${REUSE:-}" ] && [ -s "$out/$name.measured.json" ] || rm -f "$out/$name.steps.jsonl"
    serve_and_bench "$name" "$nblocks" "$maxlen" "$flags" --step-log "$out/$name.steps.jsonl"
  fi
done

for w in "${workloads[@]}"; do
  IFS='|' read -r name nblocks maxlen flags <<<"$w"
  # shellcheck disable=SC2086
  "$bin" simulate --model "$model" --hardware "$out/cpu-profile.json" \
    --tokenizer "$model" --num-gpu-blocks-override "$nblocks" --max-model-len "$maxlen" \
    $flags --json >"$out/$name.predicted.json"
done

python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
names = ["fit", "rate", "lengths", "prefix", "preempt"]
keys = [("median_ttft_ms", "TTFT p50 ms"), ("median_tpot_ms", "TPOT p50 ms"),
        ("output_throughput", "out tok/s")]
rows = []
print(f"{'workload':<9} {'metric':<12} {'predicted':>10} {'measured':>10} {'error':>8}")
for n in names:
    p = json.load(open(os.path.join(out, f"{n}.predicted.json")))
    m = json.load(open(os.path.join(out, f"{n}.measured.json")))
    for k, label in keys:
        err = (p[k] - m[k]) / m[k] * 100 if m[k] else float("nan")
        rows.append({"workload": n, "metric": k, "predicted": p[k], "measured": m[k], "error_pct": err})
        print(f"{n:<9} {label:<12} {p[k]:>10.2f} {m[k]:>10.2f} {err:>7.1f}%")
    print(f"{'':<9} {'preemptions':<12} {p.get('num_preemptions', 0):>10}")
json.dump(rows, open(os.path.join(out, "validation.json"), "w"), indent=1)
PY
