#!/usr/bin/env python3
"""Greedy reference outputs of llama.cpp on a GGUF file, as JSON.

Made with llama.cpp 0c1e57098, the source vendored by PyPI's llama-cpp-python
0.3.36 sdist (vendor/llama.cpp), built with cmake (Release, CPU only,
GGML_NATIVE=ON) twice: static tools (llama-server, llama-tokenize) in
build/, and libllama.so (BUILD_SHARED_LIBS=ON, target llama) in build-shared/
for the sdist's own ctypes bindings (llama_cpp/llama_cpp.py, imported
without the package's high-level half, so only the standard library is
needed).

Settings everywhere: f32 KV cache (type_k = type_v = F32, `-ctk f32 -ctv
f32`), flash attention off, one sequence, n_ctx 2048, n_batch 2048, n_ubatch
512, 2 threads, the file's own BOS setting. For each prompt:
- `prompt_ids`: llama_tokenize(add_special = true, parse_special = true), i.e.
  a BOS only where tokenizer.ggml.add_bos_token says so; checked equal to
  `llama-tokenize -f PROMPT --no-escape --ids`.
- `greedy_token_ids`: N new tokens: the prompt in one llama_decode, then one
  token per llama_decode, each the argmax of the last logits (the first
  maximum, as llama.cpp's greedy sampler takes it). An end-of-generation
  token is kept and generation goes on past it (vLLM's ignore_eos; llama.cpp's
  own ignore_eos bans those tokens instead, which would change the sequence).
- `top_logprobs`: the --top (default 5) highest {id, logprob} of each step,
  log-softmax of the raw logits over the whole vocab; `min_margin`: the
  smallest top1 - top2 logprob gap over the steps.
- `greedy_text`: the pieces of the greedy ids (special tokens rendered).
- `server_matches`: llama-server (`llama-server -m FILE -c 2048 -np 1 -t 2
  -ctk f32 -ctv f32 -fa off`), POST /completion with the prompt ids,
  temperature 0, top_k 1, n_predict N, gives the same ids up to where it
  stops (at an end-of-generation token, `server_stop`).
With --chat, also `chats`: CHATS below rendered by llama-server with the
file's chat template (POST /apply-template, jinja), its /v1/chat/completions
answer at temperature 0 (stops at the end of the turn) and the greedy steps
above on the rendered prompt.

    python3 make_llamacpp_refs.py --llama-cpp LLAMA_CPP_DIR --bindings SDIST/llama_cpp \
        --model FILE.gguf --prompts smollm2|fixture:REFERENCE.json --n-predict 32 \
        [--top 5] [--chat] [--no-repack] -o OUT.json

`--no-repack` runs the weights as stored, without the CPU backend's extra
buffer types (repacked layouts, AMX): ggml's generic dot products.

`--prompts fixture:../tiny-llama/reference.json` takes the six prompts and the
rendered chat prompt of a transformers reference file; `smollm2` the set below.
"""
import argparse
import ctypes
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path

LLAMA_CPP = {
    "commit": "0c1e57098",
    "version": "0.5.0-dev (ggml 0.25.3)",
    "source": "llama-cpp-python 0.3.36 sdist (PyPI), vendor/llama.cpp",
    "build": "cmake -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON (CPU only)",
}

SMOLLM2_PROMPTS = [
    ("capital", "The capital of France is"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("numbers", "Order #40213 shipped on 2024-11-30: 3 items, $19.99 each. The total is"),
    ("unicode", "Café, naïve, résumé: 東京 is the capital of Japan 🚀. In English,"),
    ("whitespace", "  Indented line\n\n\tTabbed line\n    List:\n    - one\n    - two\n    -"),
    ("long", "A scheduler decides, at every step, which requests run and how many tokens "
             "each computes. Running requests come first; waiting ones are admitted while "
             "the token budget and the free cache blocks allow it. If a block cannot be "
             "allocated, the last request is preempted and its blocks are freed. In short,"),
    ("chatml", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n<|im_start|>user\nName three colors of the rainbow."
               "<|im_end|>\n<|im_start|>assistant\n"),
]

# "What is the capital of France?" as the only message gets SmolLM2's default
# system prompt from the template; with it llama.cpp's Q4_1 x Q8_1 kernels answer
# "L'Étoile, ..." (top1 - top2 logprob margin 0.06), while the f32-dequantized
# weights (transformers' GGUF loader) answer "The capital of France is Paris."
# (margin 0.08). With the system message below both answer Paris (margin 0.1).
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is the capital of France?"}],
]

N_CTX, N_BATCH, N_UBATCH, THREADS = 2048, 2048, 512, 2
SERVER_ARGS = ["-c", str(N_CTX), "-np", "1", "-t", str(THREADS), "-ctk", "f32", "-ctv", "f32",
               "-fa", "off", "--no-webui"]
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
          "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
          "dry_multiplier": 0.0, "seed": 0}
GGML_TYPE_F32 = 0


class Direct:
    """libllama through llama-cpp-python's ctypes bindings."""

    def __init__(self, bindings: Path, libdir: Path, model: Path, repack: bool):
        os.environ["LLAMA_CPP_LIB_PATH"] = str(libdir)
        pkg = types.ModuleType("llama_cpp")  # skip the package's high-level __init__
        pkg.__path__ = [str(bindings)]
        sys.modules["llama_cpp"] = pkg
        import llama_cpp.llama_cpp as L
        self.L = L
        self._quiet = L.llama_log_callback(lambda level, text, data: None)  # kept alive
        L.llama_log_set(self._quiet, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = repack
        self.model = L.llama_model_load_from_file(str(model).encode(), mp)
        assert self.model, model
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = N_CTX, N_BATCH, N_UBATCH, 1
        cp.n_threads = cp.n_threads_batch = THREADS
        cp.type_k = cp.type_v = GGML_TYPE_F32
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = L.llama_init_from_model(self.model, cp)
        assert self.ctx
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool) -> list:
        b = text.encode()
        buf = (self.L.llama_token * (len(b) + 16))()
        n = self.L.llama_tokenize(self.vocab, b, len(b), buf, len(buf), add_special, True)
        assert n >= 0, n
        return list(buf[:n])

    def piece(self, tok: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, tok, buf, len(buf), 0, True)
        assert n >= 0, n
        return buf.raw[:n]

    def decode(self, ids: list) -> None:
        arr = (self.L.llama_token * len(ids))(*ids)
        assert self.L.llama_decode(self.ctx, self.L.llama_batch_get_one(arr, len(ids))) == 0

    def greedy(self, prompt_ids: list, n: int, keep: int) -> dict:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        self.decode(prompt_ids)
        ids, tops = [], []
        for step in range(n):
            row = self.L.llama_get_logits_ith(self.ctx, -1)[:self.n_vocab]
            best = max(range(self.n_vocab), key=row.__getitem__)  # first maximum
            m = row[best]
            lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
            order = sorted(range(self.n_vocab), key=lambda i: (-row[i], i))[:max(keep, 2)]
            assert order[0] == best
            tops.append([{"id": i, "logprob": round(row[i] - lse, 5)} for i in order])
            ids.append(best)
            if step + 1 < n:
                self.decode([best])
        margins = [t[0]["logprob"] - t[1]["logprob"] for t in tops]
        text = b"".join(self.piece(t) for t in ids).decode("utf-8", errors="replace")
        return {"greedy_token_ids": ids, "greedy_text": text,
                "min_margin": round(min(margins), 5), "top_logprobs": [t[:keep] for t in tops]}


class Server:
    def __init__(self, bindir: Path, model: Path, extra: list):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [str(bindir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
             "--port", str(self.port), *SERVER_ARGS, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                sys.exit(f"llama-server did not start:\n{self.log.read().decode()[-3000:]}")
            time.sleep(0.2)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    def greedy(self, prompt_ids: list, n: int) -> dict:
        r = self.post("/completion", {"prompt": prompt_ids, "n_predict": n, "cache_prompt": False,
                                      "return_tokens": True, **GREEDY})
        return {"tokens": r["tokens"], "stop_type": r["stop_type"]}

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)


def cli_tokenize(bindir: Path, model: Path, text: str) -> list:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
    try:
        out = subprocess.run([str(bindir / "llama-tokenize"), "-m", str(model), "-f", f.name,
                              "--no-escape", "--ids", "--log-disable"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    return json.loads(out.strip().splitlines()[-1])


def run(direct: Direct, srv: Server, ids: list, n: int, keep: int) -> dict:
    entry = direct.greedy(ids, n, keep)
    s = srv.greedy(ids, n)
    ok = s["tokens"] == entry["greedy_token_ids"][:len(s["tokens"])]
    entry["server_matches"] = ok and (len(s["tokens"]) == n or s["stop_type"] == "eos")
    entry["server_stop"] = {"stop_type": s["stop_type"], "n": len(s["tokens"])}
    # Field order: ids and text first, the long per-step list last.
    entry["top_logprobs"] = entry.pop("top_logprobs")
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True,
                    help="source tree with build/bin (static tools) and build-shared/bin (libllama.so)")
    ap.add_argument("--bindings", type=Path, required=True,
                    help="the llama_cpp/ folder of the llama-cpp-python sdist")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--top", type=int, default=5, help="top_logprobs kept per step")
    ap.add_argument("--chat", action="store_true", help="also answer CHATS with the chat template")
    ap.add_argument("--no-repack", action="store_true",
                    help="run the weights as stored, without the CPU backend's repacked "
                         "layouts (libllama's use_extra_bufts off, llama-server --no-repack)")
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    bindir = a.llama_cpp / "build" / "bin"

    chat_prompt = None
    if a.prompts == "smollm2":
        prompts = SMOLLM2_PROMPTS
    elif a.prompts.startswith("fixture:"):
        ref = json.loads(Path(a.prompts[len("fixture:"):]).read_text())
        prompts = [(p["name"], p["text"]) for p in ref["prompts"]]
        chat_prompt = ("chat", ref["chat"]["rendered_prompt"])
    else:
        sys.exit(f"unknown prompt set {a.prompts!r}")

    direct = Direct(a.bindings, a.llama_cpp / "build-shared" / "bin", a.model, not a.no_repack)
    server_extra = ["--no-repack"] if a.no_repack else []
    srv = Server(bindir, a.model, server_extra)
    out = {
        "what": "llama.cpp greedy reference outputs (see make_llamacpp_refs.py)",
        "model_file": a.model.name, "model_sha256": hashlib.sha256(a.model.read_bytes()).hexdigest(),
        "llama_cpp": LLAMA_CPP,
        "settings": {"type_k": "f32", "type_v": "f32", "flash_attn": "disabled", "n_seq_max": 1,
                     "n_ctx": N_CTX, "n_batch": N_BATCH, "n_ubatch": N_UBATCH, "threads": THREADS,
                     "n_predict": a.n_predict, "sampling": "argmax of the raw logits",
                     "eog_tokens_kept": True, "server_args": SERVER_ARGS + server_extra,
                     "server_request": GREEDY, "repack": not a.no_repack},
        "prompts": [],
    }
    try:
        for name, text in prompts + ([chat_prompt] if chat_prompt else []):
            # A rendered chat prompt already holds its BOS (where the template adds one).
            special = name != "chat"
            ids = direct.tokenize(text, special)
            if special:
                cli = cli_tokenize(bindir, a.model, text)
                assert cli == ids, (name, cli, ids)
            entry = {"name": name, "text": text, "prompt_ids": ids}
            entry.update(run(direct, srv, ids, a.n_predict, a.top))
            out["prompts"].append(entry)
            print(f"{a.model.name} {name}: {len(ids)} prompt ids, min margin "
                  f"{entry['min_margin']}, server {entry['server_matches']}", file=sys.stderr)
        for messages in (CHATS if a.chat else []):
            rendered = srv.post("/apply-template", {"messages": messages})["prompt"]
            ids = direct.tokenize(rendered, False)
            r = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 64, **GREEDY})
            entry = {"messages": messages, "rendered_prompt": rendered, "prompt_ids": ids,
                     "answer": r["choices"][0]["message"]["content"],
                     "finish_reason": r["choices"][0]["finish_reason"]}
            entry.update(run(direct, srv, ids, a.n_predict, a.top))
            out.setdefault("chats", []).append(entry)
            print(f"chat answer: {entry['answer']!r}, min margin {entry['min_margin']}",
                  file=sys.stderr)
    finally:
        srv.close()
    a.out.write_text(dumps(out) + "\n")


def dumps(v, ind: int = 0) -> str:
    """JSON with one line per field of a prompt and per greedy step."""
    def flat(x):
        return not isinstance(x, (list, dict)) or (
            isinstance(x, dict) and all(not isinstance(y, (list, dict)) for y in x.values()))
    pad = " " * (ind + 1)
    if isinstance(v, dict) and not flat(v):
        items = [f"{pad}{json.dumps(k)}: {dumps(x, ind + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * ind + "}"
    if isinstance(v, list) and v and not all(flat(x) for x in v):
        return "[\n" + ",\n".join(pad + dumps(x, ind + 1) for x in v) + "\n" + " " * ind + "]"
    return json.dumps(v, ensure_ascii=False)


if __name__ == "__main__":
    main()
