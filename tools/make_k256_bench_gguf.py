#!/usr/bin/env python3
"""Writes a Llama-shape GGUF of random F32 weights whose every matrix has
rows that are multiples of 256, so that llama-quantize can make real Q2_K,
Q3_K, IQ4_XS (and every other) tensors of it, for benchmarks beside
llama.cpp. The vocabulary is the tiny-llama fixture's (1,024 tokens,
copied with all its tokenizer keys), so the output head costs little and
the layers dominate.

Shape: hidden 1536, 8 layers, 12 heads / 2 KV heads of 128, intermediate
4096, RMSNorm eps 1e-5, RoPE base 1e4, context 4096 (about 200 M
parameters in the layers). Weights normal with std 0.02 (norms 1), seed 0.
Random weights, for speed only: the output is noise.

    PYTHON tools/make_k256_bench_gguf.py OUT.F32.gguf
    llama-quantize OUT.F32.gguf OUT.Q3_K_M.gguf Q3_K_M      # and so on

Needs numpy and gguf (gguf-py).
"""
import pathlib
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 1536, 8, 12, 2, 128, 4096
VOCAB_FROM = (pathlib.Path(__file__).resolve().parent.parent
              / "crates/sluice-model/tests/data/gguf/tiny-llama.F32.gguf")


def copy_tokenizer(reader: GGUFReader, w: GGUFWriter) -> int:
    """Copies every tokenizer.* key; returns the vocabulary size."""
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            sub = field.types[1]
            vals = [field.parts[i] for i in field.data]
            if sub == GGUFValueType.STRING:
                vals = [bytes(v).decode("utf-8") for v in vals]
            else:
                vals = [v.tolist()[0] for v in vals]
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif vtype == GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif vtype == GGUFValueType.BOOL:
            w.add_bool(name, bool(field.parts[field.data[0]][0]))
        else:
            w.add_uint32(name, int(field.parts[field.data[0]][0]))
    return n_vocab


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    reader = GGUFReader(VOCAB_FROM)
    w = GGUFWriter(out, "llama")
    w.add_name("k256-bench (random weights)")
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(1e4)
    w.add_file_type(0)
    n_vocab = copy_tokenizer(reader, w)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02))

    ones = np.ones(HIDDEN, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(n_vocab, HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", mat(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_k.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_v.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_output.weight", mat(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", mat(FFN, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", mat(FFN, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", mat(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(n_vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
