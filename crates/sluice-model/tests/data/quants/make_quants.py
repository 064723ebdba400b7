#!/usr/bin/env python3
"""Writes the weight-format fixtures that tests/quant_formats.rs checks.

For every GGUF type the kernels support, a few small tensors in ggml's byte
layout and what `gguf.quants.dequantize` makes of them (f32), plus — for the
types `gguf.quants.quantize` implements — the f32 source they were quantized
from, so the Rust quantizers can be held to the same bytes.

Run from anywhere (needs the `gguf` package and numpy):

    PYTHON crates/sluice-model/tests/data/quants/make_quants.py

Outputs, next to this script: `manifest.json` (one entry per case) and per
case `NAME.q` (the quantized bytes), `NAME.deq` (little-endian f32) and, for
quantized-from-source cases, `NAME.src` (little-endian f32).

Two kinds of case per type:
- "quantized": Gaussian-ish rows with varied scales (and a row with zeros,
  a row with a single spike, a constant row) quantized by gguf-py;
- "random": random block bytes with finite f16 scales (every nibble, high
  bit and scale pattern, including negative and subnormal scales), for the
  K types (which gguf-py cannot quantize) and the others alike.
"""

import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = pathlib.Path(__file__).resolve().parent
RNG = np.random.default_rng(20240607)

# (type, has_quantizer, row lengths)
TYPES = [
    (T.F32, True, [32, 96]),
    (T.F16, True, [32, 96]),
    (T.BF16, True, [32, 96]),
    (T.Q8_0, True, [32, 96, 320]),
    (T.Q4_0, True, [32, 96, 320]),
    (T.Q4_1, True, [32, 96, 320]),
    (T.Q5_0, True, [32, 96, 320]),
    (T.Q5_1, True, [32, 96, 320]),
    (T.Q4_K, False, [256, 512]),
    (T.Q5_K, False, [256, 512]),
    (T.Q6_K, False, [256, 512]),
    (T.IQ4_NL, False, [32, 96, 320]),
    (T.IQ4_XS, False, [256, 512]),
    (T.Q2_K, False, [256, 512]),
    (T.Q3_K, False, [256, 512]),
]
ROWS = 3

# Byte offsets of the f16 scale fields in each block type (random cases
# overwrite them with finite values so no NaN reaches the comparison).
F16_FIELDS = {
    T.Q8_0: [0],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
}


def source_rows(cols):
    rows = []
    for r in range(ROWS):
        scale = [0.02, 1.0, 37.0][r % 3]
        rows.append(RNG.standard_normal(cols).astype(np.float32) * np.float32(scale))
    x = np.stack(rows)
    # Awkward blocks: zeros, a single spike, a constant run, ties.
    x[0, :32] = 0.0
    x[1, 32 % cols : 32 % cols + 32] = 0.0
    x[1, 32 % cols + 5] = -3.5
    x[2, :32] = np.float32(0.125)
    x[2, 1] = np.float32(-0.125)
    return x


def finite_f16(n):
    """Random finite f16 values: normals of varied exponent, some negative,
    some subnormal, some zero."""
    v = RNG.standard_normal(n).astype(np.float32) * np.float32(0.05)
    h = v.astype(np.float16)
    sub = RNG.random(n) < 0.1
    h[sub] = (RNG.integers(1, 1024, sub.sum()).astype(np.uint16)).view(np.float16)
    h[RNG.random(n) < 0.05] = np.float16(0)
    return h


def random_blocks(qtype, cols):
    block, size = GGML_QUANT_SIZES[qtype]
    nblocks = ROWS * cols // block
    raw = RNG.integers(0, 256, (nblocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = finite_f16(nblocks).view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(ROWS, cols // block * size)


def write(name, arr):
    arr = np.ascontiguousarray(arr)
    (OUT / name).write_bytes(arr.tobytes())


def main():
    manifest = []
    for qtype, can_quantize, lengths in TYPES:
        for cols in lengths:
            cases = []
            if can_quantize:
                cases.append("quantized")
            if qtype not in (T.F32, T.F16, T.BF16):
                cases.append("random")
            for kind in cases:
                name = f"{qtype.name.lower()}_{kind}_{ROWS}x{cols}"
                if kind == "quantized":
                    src = source_rows(cols)
                    q = quants.quantize(src, qtype)
                    write(name + ".src", src.astype("<f4"))
                else:
                    q = random_blocks(qtype, cols)
                q = np.ascontiguousarray(q).view(np.uint8).reshape(ROWS, -1)
                deq = quants.dequantize(q, qtype).astype(np.float32)
                assert deq.shape == (ROWS, cols), (name, deq.shape)
                assert np.isfinite(deq).all(), name
                write(name + ".q", q)
                write(name + ".deq", deq.astype("<f4"))
                manifest.append(
                    {
                        "name": name,
                        "type": qtype.name,
                        "rows": ROWS,
                        "cols": cols,
                        "src": kind == "quantized",
                    }
                )
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(manifest)} cases to {OUT}")


if __name__ == "__main__":
    main()
