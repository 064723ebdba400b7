#!/usr/bin/env bash
# Quantization quality beside llama.cpp, measured as its community measures
# it: each engine's KL divergence and same-top-token rate of a quantized
# file against that engine's own run of the unquantized (F32) file, over the
# same text, in llama-perplexity's windows (context 512, second-half
# scoring). Both KV caches are f16 (each engine's default). Also runs
# sluice against llama.cpp's base, which bounds how far the two engines'
# F32 runs differ.
#
# Usage: tools/quality_vs_llamacpp.sh LLAMA_CPP_BIN_DIR TEXT OUT_DIR F32.gguf QUANT.gguf...
# Build sluice first (`cargo build --release`); SLUICE overrides the binary.
# llama.cpp's tool is `llama-perplexity` from its cmake build.
set -euo pipefail
[ $# -ge 5 ] || { sed -n 2,12p "$0"; exit 2; }
bin=$1 text=$2 out=$3 base=$4; shift 4
sluice=${SLUICE:-target/release/sluice}
mkdir -p "$out"
ctx=512
# llama-perplexity now and then ends without its closing statistics (its
# log thread is not flushed at exit): run again until they are there.
llama() {
  local log=$1; shift
  for _ in 1 2 3; do
    "$bin/llama-perplexity" -t 2 -c $ctx -f "$text" "$@" > "$log" 2>&1 || true
    if grep -qE "Same top p|Final estimate" "$log"; then return 0; fi
  done
  echo "llama-perplexity $*: no statistics in $log" >&2
  return 1
}
sl() {
  local log=$1; shift
  "$sluice" perplexity -t 2 -c $ctx -f "$text" "$@" > "$log" 2>&1 \
    || { echo "sluice perplexity $*: failed, see $log" >&2; return 1; }
}
# "value ± uncertainty" of the statistic named $2 in log $1.
stat() {
  grep -m1 -E "^$2" "$1" | sed -E 's/^[^:]*:[[:space:]]*//; s/[[:space:]]*%//; s/[[:space:]]+/ /g'
}
echo "== base: $base"
llama "$out/llama.base.log" -m "$base" --kl-divergence-base "$out/llama.base.kld"
sl "$out/sluice.base.log" -m "$base" --kl-divergence-base "$out/sluice.base.kld"
echo "   llama.cpp: $(grep -m1 'Final estimate' "$out/llama.base.log")"
echo "   sluice:    $(grep -m1 'Final estimate' "$out/sluice.base.log")"
echo
echo "| file | PPL llama.cpp | PPL sluice | mean KLD llama.cpp | mean KLD sluice | same top llama.cpp | same top sluice | sluice vs llama.cpp's base: KLD, same top |"
echo "|---|---|---|---|---|---|---|---|"
for f in "$@"; do
  n=$(basename "$f" .gguf)
  llama "$out/$n.llama.log" -m "$f" --kl-divergence-base "$out/llama.base.kld" --kl-divergence
  sl "$out/$n.sluice.log" -m "$f" --kl-divergence-base "$out/sluice.base.kld" --kl-divergence
  sl "$out/$n.cross.log" -m "$f" --kl-divergence-base "$out/llama.base.kld" --kl-divergence
  echo "| $n | $(stat "$out/$n.llama.log" 'Mean PPL\(Q\)') | $(stat "$out/$n.sluice.log" 'Mean PPL\(Q\)') \
| $(stat "$out/$n.llama.log" 'Mean    KLD') | $(stat "$out/$n.sluice.log" 'Mean    KLD') \
| $(stat "$out/$n.llama.log" 'Same top p') % | $(stat "$out/$n.sluice.log" 'Same top p') % \
| $(stat "$out/$n.cross.log" 'Mean    KLD'), $(stat "$out/$n.cross.log" 'Same top p') % |"
done
