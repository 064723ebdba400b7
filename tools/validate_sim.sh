#!/usr/bin/env bash
# Validates `sluice simulate` against `sluice serve` on this machine, on
# held-out workloads unlike any one profile's: measures a table profile with
# `sluice bench-model --profile` (a grid of step shapes, no workload), then
# runs a standard set of workloads against a fresh `sluice serve` each, twice
# (the measurement's own spread), predicts each with `sluice simulate` (the
# exact requests and send times `sluice bench` sends: `--tokenizer`, the same
# seed) and prints the errors. For comparison it also fits a profile to the
# step log of one workload (`simulate fit`, the fitted path) and predicts the
# others with it.
#
# Usage: tools/validate_sim.sh SLUICE_BIN MODEL OUT_DIR
#   MODEL: a GGUF file or a Hugging Face model directory (its tokenizer is
#   the workloads' tokenizer), e.g. SmolLM2-135M-Instruct Q4_1 from
#   tools/fetch_smollm2.sh.
# Environment: THREADS (default 2) model threads; PORT (8321); REUSE=1 keeps
# what OUT_DIR already holds (a profile, measurements) and redoes the rest;
# LOAD_FORMAT=dummy serves (and profiles) a model directory's shape with
# random weights; ONLY="c16 prefix ..." runs those workloads alone (c16 is
# always among them: the fitted path is fitted on it; p30/p70/p110 take
# their rates from c64's measurement, so they need c64).
#
# Workloads (the engine's limits: 1024 tokens a step, 64 requests, 2048
# tokens a request, serve's default KV cache):
#   c1, c16, c64     closed loop at concurrency 1, 16, 64 (128 -> 128 tokens)
#   p30, p70, p110   Poisson arrivals at 30 %, 70 %, 110 % of the capacity c64
#                    measured (requests/s, first round)
#   longprompt       1536 -> 32 tokens, concurrency 4
#   longoutput       32 -> 768 tokens, concurrency 8
#   prefix           768 shared + 64 -> 64 tokens, concurrency 16
#   preempt          256 -> 256 tokens at concurrency 32 in 160 KV blocks
# Every server writes its step log (OUT_DIR/NAME.r1.steps.jsonl). Results:
# OUT_DIR/validation.json and the table on stdout. Run it on a quiet machine:
# the profile and the measurements must see the same CPU.
set -euo pipefail
bin=$(realpath "$1") model=$(realpath "$2") out=$3
mkdir -p "$out"
out=$(realpath "$out")
port=${PORT:-8321}
threads=${THREADS:-2}
limits=(--max-num-batched-tokens 1024 --max-num-seqs 64 --max-model-len 2048)
load=()
if [ -n "${LOAD_FORMAT:-}" ]; then load=(--load-format "$LOAD_FORMAT"); fi
only=${ONLY:-}
if [ -n "$only" ] && [[ " $only " != *" c16 "* ]]; then only="c16 $only"; fi
selected() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }

if [ -z "${REUSE:-}" ] || [ ! -s "$out/profile.json" ]; then
  "$bin" bench-model --model "$model" "${load[@]}" --threads "$threads" \
    --profile "$out/profile.json" --profile-max-model-len 2048 \
    --max-num-batched-tokens 1024 --concurrency 64 --repeats 3 2>&1 | tee "$out/profile.log"
fi

wait_ready() {
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "server did not come up" >&2; return 1
}

# name | extra serve/simulate flags | workload flags
std="--random-input-len 128 --random-output-len 128 --random-range-ratio 0.5"
workloads=(
  "c1||$std --num-prompts 12 --max-concurrency 1 --seed 11"
  "c16||$std --num-prompts 64 --max-concurrency 16 --seed 12"
  "c64||$std --num-prompts 128 --max-concurrency 64 --seed 13"
  "p30||$std --num-prompts 64 --seed 14 --request-rate RATE30"
  "p70||$std --num-prompts 64 --seed 15 --request-rate RATE70"
  "p110||$std --num-prompts 96 --seed 16 --request-rate RATE110"
  "longprompt||--random-input-len 1536 --random-output-len 32 --random-range-ratio 0.25 --num-prompts 16 --max-concurrency 4 --seed 17"
  "longoutput||--random-input-len 32 --random-output-len 768 --random-range-ratio 0.25 --num-prompts 16 --max-concurrency 8 --seed 18"
  "prefix||--random-prefix-len 768 --random-input-len 64 --random-output-len 64 --random-range-ratio 0.5 --num-prompts 64 --max-concurrency 16 --seed 19"
  "preempt|--num-gpu-blocks-override 160|--random-input-len 256 --random-output-len 256 --random-range-ratio 0.5 --num-prompts 48 --max-concurrency 32 --seed 20"
)

rates() { # the Poisson rates from the first c64 measurement
  python3 - "$out/c64.r1.measured.json" <<'PY'
import json, sys
cap = json.load(open(sys.argv[1]))["request_throughput"]
print(f"{0.3 * cap:.4f} {0.7 * cap:.4f} {1.1 * cap:.4f}")
PY
}

flags_of() { # workload flags with the rates filled in
  local f=$1
  if [[ $f == *RATE* ]]; then
    read -r r30 r70 r110 <<<"$(rates)"
    f=${f//RATE110/$r110}; f=${f//RATE70/$r70}; f=${f//RATE30/$r30}
  fi
  echo "$f"
}

measure() { # name round extra flags
  local name=$1 round=$2 extra=$3 flags=$4
  local tag="$name.r$round"
  if [ -n "${REUSE:-}" ] && [ -s "$out/$tag.measured.json" ]; then return 0; fi
  rm -f "$out/$tag.steps.jsonl"
  # shellcheck disable=SC2086
  "$bin" serve --model "$model" "${load[@]}" --port "$port" --threads "$threads" "${limits[@]}" \
    $extra --step-log "$out/$tag.steps.jsonl" >"$out/$tag.serve.log" 2>&1 &
  local pid=$!
  wait_ready
  # shellcheck disable=SC2086
  "$bin" bench --base-url "http://127.0.0.1:$port" --tokenizer "$model" --ignore-eos \
    --dataset-name random $flags --save-result --result-dir "$out" \
    --result-filename "$tag.measured.json" >"$out/$tag.bench.log" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in 1 2; do
  for w in "${workloads[@]}"; do
    IFS='|' read -r name extra flags <<<"$w"
    selected "$name" || continue
    measure "$name" "$round" "$extra" "$(flags_of "$flags")"
  done
done

# The fitted path, for comparison: a profile fitted to one workload's steps.
"$bin" simulate fit "$out/c16.r1.steps.jsonl" -o "$out/fitted-c16.json" \
  --name "fitted to c16" >"$out/fit.txt"

for w in "${workloads[@]}"; do
  IFS='|' read -r name extra flags <<<"$w"
  selected "$name" || continue
  flags=$(flags_of "$flags")
  for p in profile fitted-c16; do
    kv=$extra
    # The fitted profile records no KV cache: give it serve's.
    if [ "$p" = fitted-c16 ] && [ -z "$kv" ]; then
      kv="--num-gpu-blocks-override $(python3 -c "import json;print(json.load(open('$out/profile.json'))['kv_cache']['num_blocks'])")"
    fi
    # shellcheck disable=SC2086
    "$bin" simulate --model "$model" --hardware "$out/$p.json" --tokenizer "$model" \
      "${limits[@]}" $kv $flags --json >"$out/$name.$p.predicted.json" 2>"$out/$name.$p.sim.log"
  done
done

names=()
for w in "${workloads[@]}"; do
  name=${w%%|*}
  if selected "$name"; then names+=("$name"); fi
done
python3 - "$out" "${names[@]}" <<'PY'
import json, os, re, sys
out, names = sys.argv[1], sys.argv[2:]
keys = [("median_ttft_ms", "TTFT p50 ms"), ("median_tpot_ms", "TPOT p50 ms"),
        ("output_throughput", "out tok/s")]
def load(n): return json.load(open(os.path.join(out, n)))
rows = []
print(f"{'workload':<11} {'metric':<12} {'measured':>9} {'spread':>7} {'table':>9} {'error':>7} {'fitted':>9} {'error':>7}  outside")
for n in names:
    m1, m2 = load(f"{n}.r1.measured.json"), load(f"{n}.r2.measured.json")
    pt, pf = load(f"{n}.profile.predicted.json"), load(f"{n}.fitted-c16.predicted.json")
    log = open(os.path.join(out, f"{n}.profile.sim.log")).read()
    outside = re.search(r"(\d+) of (\d+) steps \(([\d.]+)%\) were outside", log)
    outside = f"{outside.group(3)}%" if outside else "0%"
    for k, label in keys:
        m = (m1[k] + m2[k]) / 2
        spread = abs(m1[k] - m2[k]) / m * 100 if m else float("nan")
        et = (pt[k] - m) / m * 100 if m else float("nan")
        ef = (pf[k] - m) / m * 100 if m else float("nan")
        rows.append({"workload": n, "metric": k, "measured": [m1[k], m2[k]],
                     "spread_pct": spread, "table": pt[k], "table_error_pct": et,
                     "fitted": pf[k], "fitted_error_pct": ef, "outside_grid": outside})
        print(f"{n:<11} {label:<12} {m:>9.2f} {spread:>6.1f}% {pt[k]:>9.2f} {et:>6.1f}% {pf[k]:>9.2f} {ef:>6.1f}%  {outside}")
json.dump(rows, open(os.path.join(out, "validation.json"), "w"), indent=1)
PY
