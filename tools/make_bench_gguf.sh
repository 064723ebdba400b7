#!/usr/bin/env bash
# The Qwen2.5-0.5B-shape GGUF files of the README's benchmark: the built-in
# shape with random weights (tools/make_qwen05b.py), converted by llama.cpp's
# convert_hf_to_gguf.py to BF16, then quantized by llama-quantize to Q8_0
# and Q4_K_M. Files that exist are kept.
#
# Usage: tools/make_bench_gguf.sh LLAMA_CPP_DIR OUT_DIR [VOCAB...]   (default VOCAB: 32000 151936)
# LLAMA_CPP_DIR is llama.cpp's source tree with its tools built in build/bin;
# PYTHON (default python3) needs torch, transformers and numpy.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
llama=$1 out=$2; shift 2
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
convert=$here/../crates/sluice-model/tests/data/gguf/convert_fixture.py
mkdir -p "$out"
for v in "${@:-32000 151936}"; do
  for v1 in $v; do
    src=$out/src-qwen05b-v$v1 base=$out/qwen2.5-0.5b-shape-v$v1
    [ -s "$src/model.safetensors" ] || "$py" "$here/make_qwen05b.py" "$src" "$v1"
    [ -s "$base.BF16.gguf" ] || "$py" "$convert" "$llama" qwen2 "$src" "$base.BF16.gguf" --outtype bf16
    for q in Q8_0 Q4_K_M; do
      [ -s "$base.$q.gguf" ] || "$llama/build/bin/llama-quantize" "$base.BF16.gguf" "$base.$q.gguf" "$q" 2
    done
  done
done
ls -l "$out"/*.gguf
