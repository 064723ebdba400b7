"""Writes vllm-block-hashes.json: block hashes computed by vLLM's own code.

Run with the Python environment that has vLLM 0.33.0 installed:

    python make_vllm_hashes.py > vllm-block-hashes.json

Every value comes from vLLM itself (`init_none_hash`, `hash_block_tokens`,
`maybe_convert_block_hash`, the hash functions of `vllm.utils.hashing`), so
the Rust test that reads the file checks sluice's pickle / CBOR encoders and
hash chain against vLLM bit for bit. The `encodings` section pins the raw
pickle and CBOR bytes of single values (ints of every size class, strings),
including ints past 2^63 that token ids never reach.
"""

import json
import os
import pickle

import cbor2

from vllm.utils import hashing
from vllm.v1.core import kv_cache_utils as kcu

ALGOS = {"sha256": hashing.sha256, "sha256_cbor": hashing.sha256_cbor}
try:
    hashing.xxhash(b"")
    # Only reproducible with PYTHONHASHSEED set: vLLM seeds xxhash randomly.
    ALGOS["xxhash"] = hashing.xxhash
    ALGOS["xxhash_cbor"] = hashing.xxhash_cbor
except ModuleNotFoundError:
    pass

EDGE_TOKENS = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]


def chain(hash_fn, tokens, block_size, cache_salt):
    hashes = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
        parent = kcu.hash_block_tokens(
            hash_fn, parent, tokens[start : start + block_size], extra
        )
        hashes.append(parent)
    return hashes


def workloads():
    yield 4, list(range(1, 13)), None
    yield 1, [7, 7, 7], None
    yield 16, [(i * 7919) % 32000 for i in range(50)], None
    yield 3, EDGE_TOKENS, None
    yield 4, [2**32 - 1 - i for i in range(8)], None
    yield 2, [1, 2, 3, 4], "tenant-a"
    yield 2, [1, 2, 3, 4], "ü-salt/é"
    yield 4, list(range(8)), "s" * 300
    # One block past pickle's 64 KiB frame: the encoder must split frames
    # exactly where CPython does.
    yield 15000, {"offset": 2**31, "count": 15000, "modulus": None}, None
    yield 20000, {"offset": 0, "count": 20000, "modulus": 300}, None


def expand(tokens):
    """Big blocks are described by a formula (token i = offset + i, or
    offset + i % modulus) to keep the file small."""
    if isinstance(tokens, list):
        return tokens
    m = tokens["modulus"]
    return [tokens["offset"] + (i % m if m else i) for i in range(tokens["count"])]


def main():
    cases = []
    seeds = [None, "0", "12345", "a-longer-seed-string"]
    for algo, fn in ALGOS.items():
        for seed in seeds:
            if algo.startswith("xxhash") and seed is None:
                continue  # random per process in vLLM: nothing to pin
            if seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = seed
            kcu.init_none_hash(fn)
            for block_size, tokens, salt in workloads():
                hashes = chain(fn, expand(tokens), block_size, salt)
                cases.append(
                    {
                        "algo": algo,
                        "seed": seed,
                        "none_hash": kcu.NONE_HASH.hex(),
                        "block_size": block_size,
                        "tokens": tokens,
                        "cache_salt": salt,
                        "hashes": [h.hex() for h in hashes],
                        "external": [kcu.maybe_convert_block_hash(h) for h in hashes],
                    }
                )
    ints = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
            2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 2**100, 2**127 - 1,
            -1, -128, -129, -256, -(2**31), -(2**31) - 1, -(2**63), -(2**64),
            -(2**100), -(2**127)]
    encodings = [
        {
            "int": str(v),
            "pickle": pickle.dumps(v, protocol=5).hex(),
            "cbor": cbor2.dumps(v, canonical=True).hex(),
        }
        for v in ints
    ]
    for s in ["", "a", "cache_salt", "é" * 200]:
        encodings.append(
            {
                "str": s,
                "pickle": pickle.dumps(s, protocol=5).hex(),
                "cbor": cbor2.dumps(s, canonical=True).hex(),
            }
        )
    print(json.dumps({"cases": cases, "encodings": encodings}))


if __name__ == "__main__":
    main()
