#!/usr/bin/env python3
"""A random-weight Hugging Face checkpoint of sluice's built-in `qwen2.5-0.5b`
shape (crates/sluice-model/src/builtin.rs: Qwen2, hidden 896, 24 layers, 14
heads / 2 KV heads, head_dim 64, intermediate 4864, rope 1e6, eps 1e-6, q/k/v
bias, tied embeddings), saved as bf16 safetensors with tiny-qwen2's tokenizer
(llama.cpp's converter pads the vocabulary with [PAD] tokens). The input of
the GGUF benchmark files (tools/make_bench_gguf.sh); not committed.

    python tools/make_qwen05b.py OUT_DIR VOCAB   # VOCAB: 32000 (bench-model's default) or 151936 (the real model's)

Needs torch and transformers.
"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

out, vocab = Path(sys.argv[1]), int(sys.argv[2])
tiny = Path(__file__).resolve().parent.parent / "crates/sluice-model/tests/data/tiny-qwen2"
cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, head_dim=64, intermediate_size=4864,
                  vocab_size=vocab, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  rope_theta=1e6, tie_word_embeddings=True, bos_token_id=997,
                  eos_token_id=999, use_sliding_window=False, sliding_window=32768,
                  max_window_layers=24, torch_dtype="bfloat16")
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")
model.save_pretrained(out, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
    shutil.copy(tiny / f, out / f)
