#!/usr/bin/env python3
"""Converts tests/data/tiny-gemma3 to GGUF with llama.cpp's own converter and
writes the transformers references of the model that file describes.

    python crates/sluice-model/tests/data/make_tiny_gemma3_gguf.py \\
        --convert LLAMA_CPP/convert_hf_to_gguf.py

(LLAMA_CPP/gguf-py goes on PYTHONPATH for the converter.) Writes
tiny-gemma3/tiny-gemma3-f32.gguf (`--outtype f32`) and
tiny-gemma3/reference-gguf.json.

A GGUF file does not say everything config.json does, and llama.cpp fills
the gaps with Gemma 3's defaults (src/models/gemma3.cpp): the converter
writes no `query_pre_attn_scalar` (llama.cpp scales by head_dim^-0.5, the
27B aside) and no sliding-window pattern (llama.cpp makes every 6th layer
full). The fixture has query_pre_attn_scalar 24 with head_dim 32 and layers
2 and 5 full, so the file describes a different function: that of the
fixture with query_pre_attn_scalar = 32 and layer_types
[sliding x5, full]. reference-gguf.json holds transformers' outputs for
that model, in reference.json's `prompts` layout (same prompts, 32 greedy
tokens, top-5 logprobs, the logits at the last prompt position).

The converter takes token types from the SentencePiece model and from
tokenizer_config.json's `added_tokens_decoder`, not from tokenizer.json; the
fixture's tokenizer_config.json (written by transformers 5) has no
`added_tokens_decoder`, so <mask>, <start_of_turn> and <end_of_turn> would
land in the file as normal pieces that llama.cpp never matches whole. The
conversion therefore runs on a copy of the fixture whose tokenizer_config.json
gains the `added_tokens_decoder` that tokenizer.json's added tokens imply (as
the real Gemma 3 checkpoints carry): the seven specials become control tokens
with score -1000, as in Gemma 3 270M's own GGUF.

With --llama-cpp-lib DIR (a libllama.so for llama-cpp-python's bindings, the
same llama.cpp as the converter), reference-gguf.json also records what
llama.cpp itself computes from the file: its greedy ids, its largest logit
difference from the transformers logits, and whether its tokenization of
the prompts and of the chat prompt equals the fixture's.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import Gemma3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "tiny-gemma3")
MAX_NEW_TOKENS = 32
TOP_K = 5
AS_LLAMA_CPP_READS_IT = {
    "query_pre_attn_scalar": 32,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
}


def f32(x):
    """The shortest decimal that round-trips the float32 value."""
    return float(str(np.float32(x)))


def llama_cpp_outputs(gguf_path, lib_dir, base, prompts):
    """llama.cpp's own run of the file (one thread, F16 KV cache as its
    default): greedy ids as a manual argmax loop, and its tokenizer."""
    os.environ["LLAMA_CPP_LIB_PATH"] = os.path.abspath(lib_dir)
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=gguf_path,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        verbose=False,
    )
    greedy, worst = {}, 0.0
    for p in prompts:
        ids = p["input_ids"]
        llm.reset()
        llm.eval(ids)
        first = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
        worst = max(worst, float(np.abs(first - np.array(p["prompt_last_logits"])).max()))
        new = []
        for _ in range(MAX_NEW_TOKENS):
            new.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([new[-1]])
        greedy[p["name"]] = new
    chat = base["chat"]
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "greedy_token_ids": greedy,
        "greedy_equal": all(greedy[p["name"]] == p["greedy_token_ids"] for p in prompts),
        "max_abs_prompt_last_logit_diff": f32(worst),
        "prompt_ids_equal": all(
            llm.tokenize(p["text"].encode(), add_bos=True, special=True) == p["input_ids"]
            for p in base["prompts"]
        ),
        "chat_ids_equal": llm.tokenize(chat["rendered_prompt"].encode(), add_bos=False, special=True)
        == chat["input_ids"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", required=True, help="llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument(
        "--llama-cpp-lib",
        help="directory of libllama.so for llama-cpp-python: also record llama.cpp's own outputs",
    )
    args = ap.parse_args()
    out = os.path.join(FIXTURE, "tiny-gemma3-f32.gguf")
    env = dict(os.environ)
    gguf_py = os.path.join(os.path.dirname(os.path.abspath(args.convert)), "gguf-py")
    env["PYTHONPATH"] = gguf_py + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        # Same directory name: the converter derives general.name from it.
        staged = os.path.join(tmp, os.path.basename(FIXTURE))
        shutil.copytree(FIXTURE, staged, ignore=shutil.ignore_patterns("*.gguf", "reference*.json"))
        with open(os.path.join(FIXTURE, "tokenizer.json")) as f:
            added = json.load(f)["added_tokens"]
        with open(os.path.join(staged, "tokenizer_config.json")) as f:
            tok_cfg = json.load(f)
        tok_cfg["added_tokens_decoder"] = {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added
        }
        with open(os.path.join(staged, "tokenizer_config.json"), "w") as f:
            json.dump(tok_cfg, f, indent=2, ensure_ascii=False)
        subprocess.run(
            [sys.executable, args.convert, staged, "--outtype", "f32", "--outfile", out],
            check=True,
            env=env,
        )

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config = transformers.AutoConfig.from_pretrained(FIXTURE)
    for k, v in AS_LLAMA_CPP_READS_IT.items():
        setattr(config, k, v)
    model = Gemma3ForCausalLM.from_pretrained(
        FIXTURE, config=config, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    with open(os.path.join(FIXTURE, "reference.json")) as f:
        base = json.load(f)

    prompts = []
    for p in base["prompts"]:
        ids = list(p["input_ids"])
        seq = list(ids)
        steps = []
        with torch.no_grad():
            # A manual loop of full forward passes (no cache).
            for _ in range(MAX_NEW_TOKENS):
                logits = model(torch.tensor([seq])).logits[0, -1]
                steps.append(logits)
                seq.append(int(logits.argmax()))
        new = seq[len(ids):]
        tops = []
        margins = []
        for s in steps:
            lp = torch.log_softmax(s.double(), dim=-1)
            v, i = torch.topk(lp, TOP_K)
            tops.append([{"id": int(a), "logprob": f32(b)} for a, b in zip(i, v)])
            t2 = torch.topk(s, 2).values
            margins.append(float(t2[0] - t2[1]))
        prompts.append(
            {
                "name": p["name"],
                "input_ids": ids,
                "greedy_token_ids": new,
                "prompt_last_logits": [f32(x) for x in steps[0].tolist()],
                "top_logprobs": tops,
                "min_top1_top2_logit_margin": f32(min(margins)),
            }
        )
    reference = {
        "model": "tiny-gemma3 as llama.cpp reads tiny-gemma3-f32.gguf",
        "generator": "make_tiny_gemma3_gguf.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {
            "config_changes": AS_LLAMA_CPP_READS_IT,
            "why": "the GGUF holds no query_pre_attn_scalar and no sliding-window "
            "pattern; llama.cpp scales by head_dim^-0.5 and makes every 6th layer full",
            "dtype": "float32",
            "attn_implementation": "eager",
            "greedy_token_ids": "argmax of a manual loop of full forward passes",
            "top_logprobs": "per greedy step, top 5 of log_softmax in float64 of the "
            "float32 logits, best first",
            "floats": "shortest decimal that round-trips the float32 value",
        },
        "prompts": prompts,
    }
    if args.llama_cpp_lib:
        reference["llama_cpp"] = llama_cpp_outputs(out, args.llama_cpp_lib, base, prompts)
    path = os.path.join(FIXTURE, "reference-gguf.json")
    with open(path, "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")
    print(path, min(p["min_top1_top2_logit_margin"] for p in prompts))


if __name__ == "__main__":
    main()
