#!/usr/bin/env python3
"""Writes the Hugging Face source of the tiny-llama-k256 GGUF fixtures.

llama.cpp's K-quants (Q4_K, Q5_K, Q6_K) need rows that are multiples of 256;
every matrix of tiny-llama / tiny-qwen2 / tiny-qwen3 has 64-192 columns, so
their Q4_K_M and Q6_K files hold only fallback types (Q5_0, Q5_1, Q8_0).
This model has the shape that lets every matrix be a K-quant: a
LlamaForCausalLM with hidden 256, 2 layers, 4 heads / 2 KV heads of 64,
intermediate 256, untied lm_head, tiny-llama's llama3 rope scaling and
tiny-llama's tokenizer (vocab 1024, copied unchanged). Random weights
(normal, std 0.08, seed 0; RMSNorm weights 1 + 0.1 * normal), for testing
only. Only the GGUF files made from it are committed (make_gguf_fixtures.sh).

    python make_tiny_llama_k256.py OUT_DIR

Needs torch, transformers and safetensors (used: torch 2.14.0, transformers
5.20.2).
"""
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
TINY_LLAMA = HERE.parent / "tiny-llama"


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((TINY_LLAMA / "config.json").read_text())
    cfg.update(hidden_size=256, intermediate_size=256, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, initializer_range=0.08)
    cfg.pop("transformers_version", None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, cfg["initializer_range"])
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"):
        shutil.copy(TINY_LLAMA / f, out / f)
    print(f"{out}: {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
