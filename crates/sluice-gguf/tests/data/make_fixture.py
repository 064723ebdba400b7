#!/usr/bin/env python3
"""Makes the committed fixtures of sluice-gguf's tests with the `gguf` Python
package (llama.cpp's own writer, as used by convert_hf_to_gguf.py).

    PYTHON crates/sluice-gguf/tests/data/make_fixture.py

(any Python with `gguf` 0.19 and numpy will do). Writes, beside this script:

- python-v3.gguf: every metadata value type, typed arrays, an array of
  strings, a nested array, and small F32 / F16 / BF16 / Q8_0 / Q4_0 / I32
  tensors of known values (tests/python_fixture.rs checks them);
- python-big-endian.gguf: a small big-endian file, which the reader must
  refuse with a clear error;
- ggml_types.txt: the package's GGML type table (name, id, block size,
  bytes per block), which tests/ggml_types.rs compares with ours.

The output is deterministic: running it again changes no byte.
"""

import importlib.metadata
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as T

HERE = os.path.dirname(os.path.abspath(__file__))


def values(n: int, scale: float) -> np.ndarray:
    # Small exact binary fractions, so every float type holds them exactly
    # (the Q types round them, which the tests do not look at).
    return ((np.arange(n, dtype=np.float32) - n // 2) * scale).astype(np.float32)


def write_main(path: str) -> None:
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("python fixture")
    w.add_uint8("fixture.u8", 200)
    w.add_int8("fixture.i8", -100)
    w.add_uint16("fixture.u16", 60000)
    w.add_int16("fixture.i16", -30000)
    w.add_uint32("fixture.u32", 4_000_000_000)
    w.add_int32("fixture.i32", -2_000_000_000)
    w.add_float32("fixture.f32", 1.5)
    w.add_bool("fixture.bool", True)
    w.add_string("fixture.string", "h\u00e9llo \u2713 \u65e5\u672c")
    w.add_uint64("fixture.u64", 2**63 + 5)
    w.add_int64("fixture.i64", -(2**62))
    w.add_float64("fixture.f64", 3.141592653589793)
    w.add_array("fixture.array.i32", [1, -2, 3])
    w.add_array("fixture.array.f32", [0.5, -0.25])
    w.add_array("fixture.array.bool", [True, False, True])
    w.add_array("fixture.array.string", ["a", "bc", "", "\u65e5\u672c"])
    w.add_array("fixture.array.nested", [[1, 2], [3]])
    w.add_key_value("fixture.array.u8", [1, 2, 255], T.ARRAY, sub_type=T.UINT8)
    w.add_key_value("fixture.array.u64", [2**64 - 1], T.ARRAY, sub_type=T.UINT64)
    w.add_key_value("fixture.array.f64", [0.125], T.ARRAY, sub_type=T.FLOAT64)
    # Fields a model loader reads, with the types llama.cpp's converter uses.
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_rope_freq_base(10000.0)

    # numpy shape (rows, row length) is stored as dims [row length, rows].
    w.add_tensor("token_embd.weight", values(24, 0.25).reshape(3, 8))
    w.add_tensor("output_norm.weight", values(8, 0.5))
    w.add_tensor("blk.0.attn_q.weight", values(8, 0.125).astype(np.float16).reshape(2, 4))
    bf16 = gguf.quants.quantize(values(8, 0.5).reshape(2, 4), Q.BF16)
    w.add_tensor("blk.0.attn_k.weight", bf16, raw_dtype=Q.BF16)
    q8 = gguf.quants.quantize(values(128, 0.01).reshape(2, 64), Q.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=Q.Q8_0)
    q4 = gguf.quants.quantize(values(32, 0.1).reshape(1, 32), Q.Q4_0)
    w.add_tensor("blk.0.ffn_down.weight", q4, raw_dtype=Q.Q4_0)
    w.add_tensor("blk.0.ids", np.array([1, -2, 3], dtype=np.int32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_big_endian(path: str) -> None:
    w = gguf.GGUFWriter(path, arch="llama", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("fixture.u32", 7)
    w.add_tensor("t", values(4, 1.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_types(path: str) -> None:
    with open(path, "w") as f:
        version = importlib.metadata.version("gguf")
        f.write(f"# GGMLQuantizationType and GGML_QUANT_SIZES of gguf {version}\n")
        f.write("# name id block_size type_size\n")
        for t in Q:
            block, size = gguf.GGML_QUANT_SIZES[t]
            f.write(f"{t.name} {int(t)} {block} {size}\n")


def main() -> int:
    write_main(os.path.join(HERE, "python-v3.gguf"))
    write_big_endian(os.path.join(HERE, "python-big-endian.gguf"))
    write_types(os.path.join(HERE, "ggml_types.txt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
