#!/usr/bin/env python3
"""Writes the speculative-decoding reference cases the tests compare with,
computed by vLLM's own functions:

- ngram: `_find_longest_matched_ngram_and_propose_tokens` of
  vllm/v1/spec_decode/ngram_proposer.py (run without numba: the file's
  function is compiled from its source with the `@jit` line removed) on
  random token sequences, bounds, k and max_model_len;
- batch-size schedules: `build_dynamic_sd_schedule_lookup` of
  vllm/v1/spec_decode/dynamic/utils.py on valid schedules, and the
  error message of each invalid one.

Usage: tools/make_speculative_fixtures.py VLLM_PACKAGE_DIR OUT.json
  VLLM_PACKAGE_DIR: the `vllm` directory of vLLM 0.33.0 (installed, or
  unpacked from its wheel).
"""
import ast
import json
import random
import sys

import numpy as np

vllm_dir, out_path = sys.argv[1], sys.argv[2]


def load_function(path, name, extra_globals):
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = []
            module = ast.Module(body=[node], type_ignores=[])
            g = dict(extra_globals)
            exec(compile(module, path, "exec"), g)
            return g[name]
    sys.exit(f"{path}: no function {name}")


ngram = load_function(
    f"{vllm_dir}/v1/spec_decode/ngram_proposer.py",
    "_find_longest_matched_ngram_and_propose_tokens",
    {"np": np},
)
dyn_src = open(f"{vllm_dir}/v1/spec_decode/dynamic/utils.py").read()
dyn = {}
exec(compile(dyn_src, "utils.py", "exec"), dyn)

rng = random.Random(20261204)
cases = []
for _ in range(400):
    alphabet = rng.choice([2, 3, 5, 20])
    tokens = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 40))]
    lo = rng.randrange(1, 5)
    hi = lo + rng.randrange(0, 4)
    k = rng.randrange(1, 8)
    max_model_len = len(tokens) + rng.randrange(0, 10)
    got = ngram(np.array(tokens, dtype=np.int32), lo, hi, max_model_len, k)
    cases.append({
        "tokens": tokens, "min_n": lo, "max_n": hi, "k": k,
        "max_model_len": max_model_len, "proposal": [int(t) for t in got],
    })

schedules = []
valid = [
    [[1, 4, 3], [5, 16, 2], [17, 64, 1]],
    [[1, 16, 3], [32, 128, 2]],
    [[1, 1, 5]],
    [[9, 12, 0], [1, 8, 4]],
    [[1, 2, 7], [3, 3, 0], [10, 10, 2]],
]
invalid = [
    [],
    [[1, 2]],
    [[0, 4, 3]],
    [[3, 1, 2]],
    [[1, 4, -1]],
    [[1, 4, 3], [4, 8, 2]],
    [[2, 4, 3]],
    "not a list",
]
for s in valid:
    for max_num_seqs, k in [(64, 5), (8, 2), (130, 4)]:
        lookup = dyn["build_dynamic_sd_schedule_lookup"](s, max_num_seqs, k)
        schedules.append({"schedule": s, "max_num_seqs": max_num_seqs, "k": k,
                          "lookup": lookup})
errors = []
for s in invalid:
    try:
        dyn["validate_and_normalize_dynamic_sd_schedule"](s)
        sys.exit(f"{s!r} was accepted")
    except ValueError as e:
        errors.append({"schedule": s, "error": str(e)})

json.dump({"ngram": cases, "schedules": schedules, "schedule_errors": errors},
          open(out_path, "w"), separators=(",", ":"))
print(f"{out_path}: {len(cases)} ngram cases, {len(schedules)} schedules, "
      f"{len(errors)} invalid schedules")
