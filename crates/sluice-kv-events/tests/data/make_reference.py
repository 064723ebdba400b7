"""Reference msgpack bytes for sluice-kv-events' encoder: each case is a
vLLM 0.33 KVEventBatch encoded by msgspec exactly as ZmqEventPublisher does
(`msgspec.msgpack.Encoder().encode(batch)`). Writes `reference.txt`, one
`name hex` line per case; tests/encode.rs builds the same batches in Rust
and compares bytes.

Run with a Python that has vLLM 0.33.0 (and so msgspec) installed:

    PYTHON crates/sluice-kv-events/tests/data/make_reference.py
"""

import pathlib

import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)


def stored(hashes, parent, tokens, block_size=16, lora_id=None, medium=None):
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_id=lora_id,
        medium=medium,
        lora_name=None,
    )


INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
        2**63 - 1, 2**63, 2**64 - 1]

CASES = {
    "mixed": KVEventBatch(
        ts=1.5,
        events=[
            stored([1, 2**64 - 1], None, [1, 2, 3], medium="GPU"),
            BlockRemoved(block_hashes=[5], medium=None),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    ),
    "empty_events": KVEventBatch(ts=0.0, events=[], data_parallel_rank=0),
    "no_rank": KVEventBatch(ts=1733059200.123456, events=[AllBlocksCleared()]),
    "rank3": KVEventBatch(
        ts=-2.25,
        events=[BlockRemoved(block_hashes=[], medium="CPU")],
        data_parallel_rank=3,
    ),
    "int_widths": KVEventBatch(
        ts=1764590000.987654321,
        events=[
            stored(INTS, 2**63 + 12345, [0, 127, 128, 255, 256, 65535, 65536, 151935],
                   block_size=256, lora_id=2**40),
            BlockRemoved(block_hashes=INTS, medium="GPU"),
        ],
        data_parallel_rank=0,
    ),
    "long_lists": KVEventBatch(
        ts=3.0,
        events=[
            stored(list(range(20)), 99, list(range(320)), medium="m" * 40),
            BlockRemoved(block_hashes=list(range(70000, 70017)), medium="s" * 300),
        ]
        + [AllBlocksCleared()] * 17,
        data_parallel_rank=65536,
    ),
}

encoder = msgspec.msgpack.Encoder()
out = pathlib.Path(__file__).with_name("reference.txt")
out.write_text("".join(f"{name} {encoder.encode(b).hex()}\n" for name, b in CASES.items()))
