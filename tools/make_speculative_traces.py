#!/usr/bin/env python3
"""Writes the speculative-decoding scheduler traces (docs/scheduler-trace.md,
`config.speculative_config` and `requests[i].drafts`) into OUT_DIR.

    python3 tools/make_speculative_traces.py OUT_DIR [SEED]

Each family aims at one corner of vLLM 0.33's scheduling with drafts: the
token budget's edge, preemption of a request holding drafts, drafts near
`max_tokens` and `max_model_len`, prefix caching (and the placeholder
padding of a request admitted with one token left), chunked prefill beside
decodes, priority, stop tokens inside accepted drafts, aborts, a draft
model's lookahead slots and draft slots. The golden logs come from vLLM
itself: run `tools/vllm-oracle/oracle.py` on each trace.

Drafts are scripted per sampling step. The generator follows each request's
output position as if nothing interfered, and proposes drafts that match the
next outputs for a random run and then diverge, or are all wrong, or are
empty; a budget cut or a preemption moves the real position, so some
proposals then miss, which the traces keep on purpose.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def drafts_for(rng: random.Random, output: list[int], max_tokens: int, k: int,
               vocab: int, p_good: float) -> list[list[int]]:
    """One draft list per sampling step the request can have."""
    drafts = []
    pos = 1  # outputs known after the first sampling step
    while pos < max_tokens and len(drafts) < max_tokens:
        n = rng.randint(0, k) if rng.random() < 0.9 else k
        if rng.random() < p_good:
            run = rng.randint(0, n)
            d = output[pos:pos + run]
            d += [rng.randrange(vocab) for _ in range(n - len(d))]
            # A wrong token after the run, so the run is what is accepted.
            if len(d) > run and pos + run < len(output) and d[run] == output[pos + run]:
                d[run] = (d[run] + 1) % vocab
            accepted = run
        else:
            d = [rng.randrange(vocab) for _ in range(n)]
            accepted = 0
        drafts.append(d)
        pos += accepted + 1
    return drafts


def request(rng, rid, *, prompt_len, out_len, k, vocab=1000, p_good=0.7,
            arrival=0, priority=0, prompt=None, stop=None, eos=None,
            max_tokens=None):
    output = [rng.randrange(vocab) for _ in range(out_len)]
    max_tokens = out_len if max_tokens is None else max_tokens
    r = {
        "id": rid,
        "arrival_step": arrival,
        "priority": priority,
        "prompt": prompt if prompt is not None
        else [rng.randrange(vocab) for _ in range(prompt_len)],
        "output": output,
        "max_tokens": max_tokens,
    }
    if stop is not None:
        r["stop_token_ids"] = stop
    if eos is not None:
        r["eos_token_id"] = eos
    r["drafts"] = drafts_for(rng, output, max_tokens, k, vocab, p_good)
    return r


def config(*, bs=16, blocks=256, budget=256, seqs=8, mml=2048, chunked=True,
           prefix=False, thr=0, policy="fcfs", method="ngram", k=4):
    return {
        "block_size": bs,
        "num_gpu_blocks": blocks,
        "max_num_batched_tokens": budget,
        "max_num_seqs": seqs,
        "max_model_len": mml,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": prefix,
        "long_prefill_token_threshold": thr,
        "policy": policy,
        "speculative_config": {"method": method, "num_speculative_tokens": k},
    }


def family_budget(rng, i):
    """Decodes with drafts fill the token budget exactly: drafts are cut."""
    k = rng.choice([3, 4, 5])
    n = rng.randint(4, 7)
    budget = n * (1 + k) - rng.randint(1, k + 2)
    reqs = [request(rng, f"b{j}", prompt_len=rng.randint(5, 40), out_len=rng.randint(20, 40),
                    k=k, p_good=0.9) for j in range(n)]
    return config(budget=budget, seqs=n, k=k, method=rng.choice(["ngram", "draft_model"]),
                  prefix=bool(i % 2)), reqs, []


def family_preempt(rng, i):
    """A pool too small for everyone: requests holding drafts are preempted."""
    k = rng.choice([2, 4])
    reqs = [request(rng, f"p{j}", prompt_len=rng.randint(20, 90), out_len=rng.randint(40, 90),
                    k=k, arrival=rng.randint(0, 6)) for j in range(6)]
    method = "draft_model" if i % 2 else "ngram"
    return config(bs=16, blocks=rng.randint(22, 30), budget=128, seqs=6, k=k, method=method,
                  prefix=bool(i % 2)), reqs, []


def family_maxtokens(rng, i):
    """Drafts reaching past max_tokens, and max_model_len close by."""
    k = rng.choice([4, 6])
    mml = rng.choice([48, 64])
    reqs = []
    for j in range(5):
        p = rng.randint(8, mml // 2)
        out = rng.randint(3, 12)
        reqs.append(request(rng, f"m{j}", prompt_len=p, out_len=mml, k=k, p_good=0.95,
                            max_tokens=out if j % 2 else mml - p))
    return config(bs=8, blocks=64, budget=128, seqs=5, mml=mml, k=k,
                  method=rng.choice(["ngram", "draft_model"])), reqs, []


def family_prefix(rng, i):
    """Shared prompts (some block-aligned plus one token: a full hit leaves
    one token to compute, which vLLM pads with placeholder drafts)."""
    k = rng.choice([3, 4])
    bs = 16
    base = [rng.randrange(1000) for _ in range(bs * rng.randint(2, 4) + 1)]
    reqs = [request(rng, "first", prompt_len=0, prompt=base, out_len=24, k=k)]
    for j in range(6):
        if j % 3 == 0:
            prompt = list(base)  # the whole prompt is cached: one token left
        elif j % 3 == 1:
            prompt = base[: bs * 2] + [rng.randrange(1000) for _ in range(rng.randint(1, 20))]
        else:
            prompt = [rng.randrange(1000) for _ in range(rng.randint(10, 50))]
        reqs.append(request(rng, f"s{j}", prompt_len=0, prompt=prompt,
                            out_len=rng.randint(10, 30), k=k, arrival=rng.randint(2, 20)))
    return config(bs=bs, blocks=160, budget=256, seqs=4, k=k, prefix=True,
                  method="draft_model" if i % 2 else "ngram"), reqs, []


def family_chunked(rng, i):
    """Long prompts in chunks beside requests verifying drafts."""
    k = rng.choice([3, 5])
    reqs = [request(rng, f"d{j}", prompt_len=rng.randint(5, 30), out_len=rng.randint(30, 60), k=k)
            for j in range(3)]
    for j in range(3):
        reqs.append(request(rng, f"c{j}", prompt_len=rng.randint(300, 900), out_len=rng.randint(5, 20),
                            k=k, arrival=rng.randint(1, 15)))
    thr = 64 if i % 2 else 0
    return config(bs=16, blocks=400, budget=rng.choice([96, 128, 200]), seqs=6, k=k, thr=thr,
                  method="ngram" if i % 2 else "draft_model", prefix=bool(i % 2)), reqs, []


def family_priority(rng, i):
    """Priority scheduling with drafts: urgent arrivals preempt decoders."""
    k = 3
    reqs = []
    for j in range(7):
        reqs.append(request(rng, f"q{j}", prompt_len=rng.randint(20, 80), out_len=rng.randint(20, 60),
                            k=k, arrival=rng.randint(0, 25), priority=rng.randint(0, 3)))
    rng.shuffle(reqs)
    return config(bs=16, blocks=rng.randint(20, 28), budget=160, seqs=4, k=k, policy="priority",
                  method="draft_model" if i % 2 else "ngram", prefix=True), reqs, []


def family_stops(rng, i):
    """Stop tokens and EOS inside runs of accepted drafts."""
    k = 5
    reqs = []
    for j in range(6):
        r = request(rng, f"e{j}", prompt_len=rng.randint(5, 30), out_len=30, k=k, p_good=1.0)
        # Put a stop (or EOS) token a few outputs in, inside a draft run.
        at = rng.randint(3, 20)
        tok = 5000 + j
        r["output"][at] = tok
        r["drafts"] = drafts_for(rng, r["output"], r["max_tokens"], k, 1000, 1.0)
        if j % 2:
            r["stop_token_ids"] = [tok]
        else:
            r["eos_token_id"] = tok
        reqs.append(r)
    return config(bs=16, blocks=120, budget=256, seqs=6, k=k,
                  method="ngram" if i % 2 else "draft_model"), reqs, []


def family_aborts(rng, i):
    """Aborts of requests that hold drafts, mid-verification."""
    k = 4
    reqs = [request(rng, f"a{j}", prompt_len=rng.randint(5, 60), out_len=rng.randint(20, 50), k=k,
                    arrival=rng.randint(0, 5)) for j in range(5)]
    aborts = [{"step": rng.randint(2, 15), "id": f"a{j}"} for j in rng.sample(range(5), 3)]
    return config(bs=16, blocks=100, budget=64, seqs=5, k=k, prefix=True,
                  method="draft_model" if i % 2 else "ngram"), reqs, aborts


def family_nochunk(rng, i):
    """Chunked prefill off: a prompt waits for a budget the drafts share."""
    k = 4
    reqs = [request(rng, f"n{j}", prompt_len=rng.randint(10, 120), out_len=rng.randint(15, 40), k=k,
                    arrival=rng.randint(0, 10)) for j in range(6)]
    return config(bs=16, blocks=200, budget=128, seqs=6, mml=512, chunked=False, k=k,
                  method="ngram" if i % 2 else "draft_model"), reqs, []


FAMILIES = [
    ("budget", family_budget, 3),
    ("preempt", family_preempt, 4),
    ("maxlen", family_maxtokens, 3),
    ("prefix", family_prefix, 4),
    ("chunked", family_chunked, 3),
    ("priority", family_priority, 3),
    ("stops", family_stops, 2),
    ("aborts", family_aborts, 2),
    ("nochunk", family_nochunk, 2),
]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seed = int(argv[2]) if len(argv) == 3 else 20261204
    rng = random.Random(seed)
    for name, make, count in FAMILIES:
        for i in range(count):
            cfg, reqs, aborts = make(rng, i)
            trace = {"name": f"spec-{name}-{i + 1:02d}", "config": cfg, "requests": reqs,
                     "aborts": aborts, "max_steps": 3000}
            path = out / f"spec-{name}-{i + 1:02d}.trace.json"
            path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
