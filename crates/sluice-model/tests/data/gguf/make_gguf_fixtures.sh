#!/usr/bin/env bash
# Makes the GGUF test fixtures in this directory and llama.cpp's greedy
# references on them (not run by CI; the outputs are committed).
#
# Tools: llama.cpp 0c1e57098, the source vendored by PyPI's llama-cpp-python
# 0.3.36 sdist (pip download --no-deps --no-binary llama-cpp-python
# llama-cpp-python==0.3.36; unpacked at $LLAMA_CPP_PYTHON, its vendor/llama.cpp
# copied to $LLAMA_CPP), built outside the repository:
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
#     -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
# (On a CPU with AMX, GGML_NATIVE=ON also builds ggml's AMX buffer type,
# which crashed every run on the machine the IQ4_NL / Q2_K / Q3_K_M /
# IQ4_XS fixtures were referenced on; they were made with GGML_NATIVE=OFF
# and the AVX-512 (F, BW, VL, VNNI, VBMI, BF16), AVX-VNNI, AVX2, FMA, F16C
# and BMI2 flags on, AMX off.)
#   cmake --build build -j2 --target llama-quantize llama-server llama-tokenize
#   cmake -B build-shared (the same flags) -DBUILD_SHARED_LIBS=ON
#   cmake --build build-shared -j2 --target llama     # libllama.so for the sdist's ctypes bindings
# Its convert_hf_to_gguf.py (through convert_fixture.py, which only names the
# pre-tokenizer the fixtures' own tokenizers use) and gguf-py run on a Python
# with torch and transformers (used: torch 2.14.0, transformers 5.20.2).
#
#   LLAMA_CPP=/path/to/llama.cpp LLAMA_CPP_PYTHON=/path/to/llama_cpp_python-0.3.36 \
#     PYTHON=/path/to/python ./make_gguf_fixtures.sh
#
# Makes, from the random-weight fixtures ../tiny-llama, ../tiny-qwen2 and
# ../tiny-qwen3:
#   NAME.F32.gguf                convert_hf_to_gguf.py --outtype f32
#   NAME.{Q8_0,Q4_0,Q5_0,Q4_K_M,IQ4_NL}.gguf   llama-quantize NAME.F32.gguf OUT TYPE
#   tiny-qwen2.{F16,BF16,Q4_1,Q5_1}.gguf  likewise
# (their rows, 64-192 long, are not multiples of 256: Q4_K_M falls back to
# Q5_0/Q8_0, and a Q6_K file would be all Q8_0, tensor for tensor the Q8_0
# file, so none is kept), and tiny-llama-k256.{Q4_K_M,Q5_K_M,Q6_K}.gguf, real
# K-quants, from make_tiny_llama_k256.py's model (its F32 file is not kept),
# and tiny-llama-k256.{Q2_K,Q3_K_M,IQ4_XS}.gguf requantized from its Q6_K
# file (llama-quantize --allow-requantize), then
#   tensor-types.json            dump_tensor_types.py: each file's tensor types
#   llamacpp/FILE.json           make_llamacpp_refs.py: greedy ids, 32 tokens,
#                                the prompts of the fixture's reference.json
#   llamacpp/SmolLM2-135M-Instruct.Q4_1.json   the same on the real model, when
#                                SLUICE_SMOLLM2_GGUF names it (.ci/test fetches it)
set -euo pipefail
cd "$(dirname "$0")"
: "${LLAMA_CPP:?set LLAMA_CPP to the llama.cpp source tree with build/bin}"
: "${LLAMA_CPP_PYTHON:?set LLAMA_CPP_PYTHON to the unpacked llama-cpp-python sdist}"
PYTHON=${PYTHON:-python3}
BIN=$LLAMA_CPP/build/bin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

quantize() { # [--allow-requantize] SRC NAME TYPE...
  local flags=()
  if [ "$1" = --allow-requantize ]; then flags=(--allow-requantize); shift; fi
  local src=$1 name=$2; shift 2
  for t in "$@"; do
    "$BIN/llama-quantize" "${flags[@]}" "$src" "$name.$t.gguf" "$t" 2 \
      > "$tmp/quantize-$name-$t.log" 2>&1 || { cat "$tmp/quantize-$name-$t.log"; exit 1; }
  done
}

convert() { # PRE MODEL_DIR OUT
  "$PYTHON" convert_fixture.py "$LLAMA_CPP" "$1" "$2" "$3" --outtype f32 > "$tmp/convert.log" 2>&1 ||
    { cat "$tmp/convert.log"; exit 1; }
}

rm -f ./*.gguf llamacpp/*.json
for spec in tiny-llama:llama-bpe tiny-qwen2:qwen2 tiny-qwen3:qwen2; do
  name=${spec%%:*} pre=${spec#*:}
  convert "$pre" "../$name" "$name.F32.gguf"
  quantize "$name.F32.gguf" "$name" Q8_0 Q4_0 Q5_0 Q4_K_M IQ4_NL
done
quantize tiny-qwen2.F32.gguf tiny-qwen2 F16 BF16 Q4_1 Q5_1

"$PYTHON" make_tiny_llama_k256.py "$tmp/k256" > /dev/null 2>&1
convert llama-bpe "$tmp/k256" "$tmp/k256.F32.gguf"
quantize "$tmp/k256.F32.gguf" tiny-llama-k256 Q4_K_M Q5_K_M Q6_K
# The low-bit K and I types came later, from the Q6_K file (its F32 source
# is not kept, and the model needs torch to rebuild): requantized.
quantize --allow-requantize tiny-llama-k256.Q6_K.gguf tiny-llama-k256 Q2_K Q3_K_M IQ4_XS

PYTHONPATH=$LLAMA_CPP/gguf-py "$PYTHON" dump_tensor_types.py *.gguf > tensor-types.json

mkdir -p llamacpp
refs=(--llama-cpp "$LLAMA_CPP" --bindings "$LLAMA_CPP_PYTHON/llama_cpp")
for f in *.gguf; do
  name=${f%%.*}
  [ "$name" = tiny-llama-k256 ] && ref=../tiny-llama/reference.json || ref=../$name/reference.json
  python3 make_llamacpp_refs.py "${refs[@]}" --model "$f" --prompts "fixture:$ref" \
    --n-predict 32 --top 3 -o "llamacpp/${f%.gguf}.json"
done
if [ -n "${SLUICE_SMOLLM2_GGUF:-}" ]; then
  python3 make_llamacpp_refs.py "${refs[@]}" --model "$SLUICE_SMOLLM2_GGUF" --prompts smollm2 \
    --n-predict 32 --chat -o llamacpp/SmolLM2-135M-Instruct.Q4_1.json
fi
