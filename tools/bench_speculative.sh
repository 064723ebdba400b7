#!/usr/bin/env bash
# Speculative decoding beside llama.cpp's, one request at a time, greedy,
# on the three prompts of tools/speculative_prompts/ (a code edit, a summary
# that quotes its input, an open-ended story) in Qwen's chat format:
# sluice generate with no speculation, n-gram, suffix decoding and a draft
# model; llama-server with no speculation, its n-gram modes and the same
# draft model. Every configuration runs on every prompt in turn, REPEATS
# rounds, interleaved. Reports decode tokens/s (prompt processing
# excluded: sluice's decode_tok_s, llama.cpp's predicted_per_second) and
# acceptance (accepted / draft tokens), the median over rounds.
#
# Usage: tools/bench_speculative.sh SLUICE_BIN LLAMA_BIN_DIR TARGET.gguf DRAFT.gguf OUT_DIR
#   LLAMA_BIN_DIR holds llama-server. THREADS (default 2), MAX_TOKENS
#   (default 256), REPEATS (default 2), PORT (default 8391).
# Writes OUT_DIR/results.jsonl (one line per run) and prints the table.
set -euo pipefail
sluice=$(realpath "$1") llama=$(realpath "$2") target=$(realpath "$3") draft=$(realpath "$4")
out=$5
mkdir -p "$out"
out=$(realpath "$out")
here=$(cd "$(dirname "$0")" && pwd)
threads=${THREADS:-2} max_tokens=${MAX_TOKENS:-256} repeats=${REPEATS:-2} port=${PORT:-8391}
results=$out/results.jsonl
: > "$results"

chat() {
  printf '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$(cat "$here/speculative_prompts/$1.txt")"
}

# name|--speculative-config JSON (empty: none)
sluice_configs=(
  "none|"
  "ngram|{\"method\": \"ngram\", \"num_speculative_tokens\": 8, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}"
  "suffix|{\"method\": \"suffix\", \"num_speculative_tokens\": 16}"
  "draft|{\"model\": \"$draft\", \"num_speculative_tokens\": 4}"
)
# name|llama-server flags
llama_configs=(
  "none|"
  "ngram-simple|--spec-type ngram-simple"
  "ngram-simple-n4-m16|--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 16"
  "ngram-mod|--spec-type ngram-mod"
  "draft|--spec-type draft-simple --model-draft $draft --spec-draft-n-max 4 -td $threads"
)

run_sluice() { # prompt name json round
  local args=()
  [ -n "$3" ] && args=(--speculative-config "$3")
  local err
  err=$("$sluice" generate --model "$target" --prompt "$(chat "$1")" --max-tokens "$max_tokens" \
    --temperature 0 --threads "$threads" --max-model-len 4096 "${args[@]}" 2>&1 >"$out/sluice-$1-$2.txt")
  python3 - "$1" "$2" "$4" "$err" >>"$results" <<'PY'
import json, re, sys
prompt, name, rnd, err = sys.argv[1:5]
m = re.search(r"completion_tokens=(\d+).*decode_tok_s=([\d.]+)", err)
if not m:
    sys.exit(f"sluice {name} on {prompt}: no decode rate in {err!r}")
s = re.search(r"draft_tokens=(\d+) accepted_tokens=(\d+)", err)
print(json.dumps({"engine": "sluice", "config": name, "prompt": prompt, "round": int(rnd),
                  "tokens": int(m.group(1)), "decode_tok_s": float(m.group(2)),
                  "draft_tokens": int(s.group(1)) if s else 0,
                  "accepted": int(s.group(2)) if s else 0}))
PY
}

run_llama() { # prompt name flags round
  # shellcheck disable=SC2086
  "$llama/llama-server" --model "$target" -t "$threads" -c 4096 --parallel 1 --port "$port" \
    --no-webui $3 >"$out/llama-server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
  python3 - "$1" "$2" "$4" "$port" "$max_tokens" "$(chat "$1")" "$out" >>"$results" <<'PY'
import json, sys, urllib.request
prompt, name, rnd, port, max_tokens, text, out = sys.argv[1:8]
body = json.dumps({"prompt": text, "n_predict": int(max_tokens), "temperature": 0,
                   "top_k": 1, "cache_prompt": False, "seed": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                             {"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=600))
open(f"{out}/llama-{prompt}-{name}.txt", "w").write(r["content"])
t = r["timings"]
print(json.dumps({"engine": "llama.cpp", "config": name, "prompt": prompt, "round": int(rnd),
                  "tokens": t["predicted_n"], "decode_tok_s": t["predicted_per_second"],
                  "draft_tokens": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}))
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in $(seq 1 "$repeats"); do
  for prompt in code_edit quoting_summary story; do
    for c in "${sluice_configs[@]}"; do
      echo "== round $round $prompt sluice ${c%%|*}" >&2
      run_sluice "$prompt" "${c%%|*}" "${c#*|}" "$round"
    done
    for c in "${llama_configs[@]}"; do
      echo "== round $round $prompt llama.cpp ${c%%|*}" >&2
      run_llama "$prompt" "${c%%|*}" "${c#*|}" "$round"
    done
  done
done

python3 - "$results" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["engine"], r["config"], r["prompt"])].append(r)
prompts = ["code_edit", "quoting_summary", "story"]
print(f"{'engine':10} {'config':22}" + "".join(f" {p:>24}" for p in prompts))
keys = sorted({(e, c) for e, c, _ in by}, key=lambda k: (k[0] != "sluice", k[1] != "none", k[1]))
for e, c in keys:
    cells = []
    for p in prompts:
        rs = by.get((e, c, p), [])
        if not rs:
            cells.append(f"{'-':>24}")
            continue
        rate = statistics.median(r["decode_tok_s"] for r in rs)
        d = sum(r["draft_tokens"] for r in rs)
        a = sum(r["accepted"] for r in rs)
        acc = f" ({100 * a / d:.0f}%)" if d else ""
        cells.append(f"{rate:>15.1f} tok/s{acc:>6}"[-24:].rjust(24))
    print(f"{e:10} {c:22}" + "".join(f" {x}" for x in cells))
PY
