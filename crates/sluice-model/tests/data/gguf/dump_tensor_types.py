#!/usr/bin/env python3
"""Writes tensor-types.json: what each GGUF file here actually holds.

For every *.gguf given: general.file_type, the tokenizer keys that matter to a
loader (model, pre, bos/eos ids, add_bos_token) and, per tensor, its ggml type
and shape (ggml order: row length first), as read by gguf-py's GGUFReader.
The quantizer falls back to other types where a row length is not a multiple
of a type's block (256 for the K-quants), so the file name alone does not say.

    PYTHONPATH=LLAMA_CPP/gguf-py python dump_tensor_types.py *.gguf > tensor-types.json
"""
import json
import sys
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

KEYS = ["general.architecture", "general.file_type", "tokenizer.ggml.model",
        "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.add_bos_token"]


def value(field):
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode()
    v = field.parts[field.data[0]][0]
    return bool(v) if field.types[0] == GGUFValueType.BOOL else int(v)


def main() -> None:
    out = {}
    for path in sys.argv[1:]:
        r = GGUFReader(path)
        meta = {k: value(r.fields[k]) for k in KEYS if k in r.fields}
        tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(d) for d in t.shape]}
                   for t in r.tensors}
        counts = {}
        for t in tensors.values():
            counts[t["type"]] = counts.get(t["type"], 0) + 1
        out[Path(path).name] = {"metadata": meta, "type_counts": counts, "tensors": tensors}
    lines = ["{"]
    for i, (name, f) in enumerate(out.items()):
        lines.append(f' {json.dumps(name)}: {{')
        lines.append(f'  "metadata": {json.dumps(f["metadata"])},')
        lines.append(f'  "type_counts": {json.dumps(f["type_counts"])},')
        lines.append('  "tensors": {')
        items = list(f["tensors"].items())
        for j, (t, v) in enumerate(items):
            lines.append(f'   {json.dumps(t)}: {json.dumps(v)}' + ("," if j + 1 < len(items) else ""))
        lines.append('  }')
        lines.append(' }' + ("," if i + 1 < len(out) else ""))
    lines.append("}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
