#!/usr/bin/env python3
"""llama.cpp's perplexity figures on the tiny-llama GGUF fixtures, for
tests/perplexity.rs.

Runs `llama-perplexity` (give the directory holding it) on text.txt with
the F32 fixture (context 64, 4 chunks), keeps the base log-probability
file it writes (tiny-llama.F32.c64.kld) and, for each quantized fixture,
its --kl-divergence figures against that base. Writes llamacpp.json.

llama.cpp's defaults throughout, as its users run it: an f16 KV cache and
flash attention on (auto, on a CPU); with flash attention llama.cpp casts
even an f32 cache to f16 (`-ctk f32` gives the same figures), so these are
f16-cache references.

llama-perplexity sometimes exits 0 before its log thread has printed the
last lines; a run whose output lacks the final figures is repeated.

    python3 make_llamacpp_refs.py --llama-bin LLAMA_CPP/build/bin
"""

import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = os.path.join(HERE, "..", "..", "..", "..", "sluice-model", "tests", "data", "gguf")
TEXT = os.path.join(HERE, "text.txt")
BASE = os.path.join(HERE, "tiny-llama.F32.c64.kld")
N_CTX = 64
QUANTS = ["Q4_0", "Q5_0", "Q8_0", "Q4_K_M", "IQ4_NL"]


def run(cmd, want):
    for _ in range(5):
        p = subprocess.run(cmd, capture_output=True, text=True)
        out = p.stdout + p.stderr
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{out[-2000:]}")
        if re.search(want, out):
            return out
    sys.exit(f"{' '.join(cmd)}: no {want!r} in five runs")


def number(pattern, out):
    m = re.search(pattern, out)
    if not m:
        sys.exit(f"no {pattern!r} in the output")
    return [float(g) for g in m.groups()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", required=True, help="directory holding llama-perplexity")
    ap.add_argument("--threads", default="2")
    args = ap.parse_args()
    exe = os.path.join(args.llama_bin, "llama-perplexity")
    common = ["-c", str(N_CTX), "-b", str(N_CTX), "-t", args.threads]

    out = run(
        [exe, "-m", os.path.join(GGUF, "tiny-llama.F32.gguf"), "-f", TEXT, "--chunks", "4",
         "--kl-divergence-base", BASE] + common,
        r"Final estimate",
    )
    ppl, err = number(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    chunks = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", out)]
    refs = {
        "llama_cpp": "llama.cpp 0c1e570 (PyPI llama-cpp-python 0.3.36's vendored source)",
        "n_ctx": N_CTX,
        "kv_cache": "f16 (llama.cpp's default), flash attention auto",
        "f32": {"ppl": ppl, "ppl_err": err, "ppl_by_chunk": chunks},
        "kl_divergence": {},
    }
    for q in QUANTS:
        out = run(
            [exe, "-m", os.path.join(GGUF, f"tiny-llama.{q}.gguf"), "--kl-divergence-base",
             BASE, "--kl-divergence"] + common,
            r"Same top p:",
        )
        kld, kld_u = number(r"Mean    KLD:\s+([0-9.]+)\s*±\s*([0-9.]+)", out)
        top, top_u = number(r"Same top p:\s+([0-9.]+)\s*±\s*([0-9.]+) %", out)
        ppl_q, _ = number(r"Mean PPL\(Q\)\s+:\s+([0-9.]+)\s*±\s*([0-9.]+)", out)
        refs["kl_divergence"][q] = {
            "kld": kld, "kld_err": kld_u, "same_top_percent": top,
            "same_top_err": top_u, "ppl": ppl_q,
        }
    with open(os.path.join(HERE, "llamacpp.json"), "w") as f:
        json.dump(refs, f, indent=1)
        f.write("\n")
    print(json.dumps(refs["f32"]), file=sys.stderr)


if __name__ == "__main__":
    main()
