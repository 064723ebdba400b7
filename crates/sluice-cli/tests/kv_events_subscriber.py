"""A KV-events consumer as a prefix-aware router would be one, written from
vLLM 0.33's wire format and hash definition, not from sluice's code: it
subscribes to a running `sluice serve --kv-events-config` with pyzmq,
decodes each batch with msgpack, sends one completion whose prompt is given
as token ids, and checks that a published `BlockStored` carries the prompt's
full blocks under the hashes vLLM computes for them. Then it asks the replay
socket for every batch from sequence number 0 and checks the same there.

    python kv_events_subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT BASE_URL TOPIC BLOCK_SIZE HASHES_JSON

vLLM's layout (vllm/distributed/kv_events.py, encoded by msgspec):
- PUB: multipart `[topic, seq (8 bytes, big-endian), payload]`;
- payload: `KVEventBatch` as an array `[ts, events, data_parallel_rank]`,
  each event a map tagged by its `"type"` (`BlockStored`, `BlockRemoved`,
  `AllBlocksCleared`);
- replay (ROUTER): send `[b"", start seq]` from a REQ-like DEALER, get
  `[b"", topic, seq, payload]` per buffered batch, then
  `[b"", b"", -1 (8 bytes), b""]`.

Block hashes (vllm/v1/core/kv_cache_utils.py, `sha256` algorithm): block
i's hash is sha256(pickle protocol 5 of (parent, tuple(tokens), None)), the
first block's parent being NONE_HASH = sha256(pickle of the string
PYTHONHASHSEED, or "vllm-none-hash" when it is unset). Events carry the
digest's last 8 bytes as a big-endian integer. The hash function is first
checked against HASHES_JSON (block hashes vLLM's own functions computed).

Exits 0 when every check holds; otherwise prints what differed and exits 1.
"""

import hashlib
import json
import os
import pickle
import sys
import time
import urllib.request

import msgpack
import zmq

TIMEOUT_S = 60


def digest(value):
    return hashlib.sha256(pickle.dumps(value, protocol=5)).digest()


def none_hash(seed):
    return digest(seed if seed else "vllm-none-hash")


def block_hashes(tokens, block_size, seed):
    """vLLM's hash chain over the full blocks of `tokens`, external form."""
    out, parent = [], none_hash(seed)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = digest((parent, tuple(tokens[start:start + block_size]), None))
        out.append(int.from_bytes(parent[-8:], "big"))
    return out


def check_against_vllm(path):
    """The hash chain above against hashes computed by vLLM itself."""
    with open(path) as f:
        cases = json.load(f)["cases"]
    checked = 0
    for case in cases:
        if case["algo"] != "sha256" or not isinstance(case["tokens"], list):
            continue
        if case["cache_salt"] is not None:
            continue
        got = block_hashes(case["tokens"], case["block_size"], case["seed"])
        if got != case["external"]:
            sys.exit(f"hash chain differs from vLLM's on {case}: {got}")
        checked += 1
    if checked == 0:
        sys.exit(f"{path}: no unsalted sha256 case to check the hash chain against")


def local(endpoint):
    """A bound endpoint (`tcp://*:PORT`) as a client connects to it."""
    return endpoint.replace("*", "127.0.0.1")


def complete(base_url, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"{base_url}/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        if resp.status != 200:
            sys.exit(f"completion: HTTP {resp.status}")
        resp.read()


def decode(frames, topic, problems):
    """One PUB / replay message: (seq, events), checking its framing."""
    if len(frames) != 3:
        problems.append(f"a message of {len(frames)} frames, expected 3")
        return None, []
    if frames[0] != topic:
        problems.append(f"topic {frames[0]!r}, expected {topic!r}")
    if len(frames[1]) != 8:
        problems.append(f"seq of {len(frames[1])} bytes, expected 8")
    seq = int.from_bytes(frames[1], "big", signed=True)
    batch = msgpack.unpackb(frames[2], raw=False)
    if not (isinstance(batch, list) and len(batch) in (2, 3)):
        problems.append(f"batch {batch!r}: expected [ts, events, rank]")
        return seq, []
    ts, events = batch[0], batch[1]
    if not isinstance(ts, float) or abs(ts - time.time()) > 3600:
        problems.append(f"batch ts {ts!r} is not the current wall time")
    return seq, events


def finds(events, want_hashes, tokens, block_size, problems):
    """Whether `events` store the prompt's blocks, checking their fields."""
    for e in events:
        if e.get("type") != "BlockStored" or e.get("block_hashes") != want_hashes:
            continue
        n = len(want_hashes) * block_size
        if e.get("parent_block_hash") is not None:
            problems.append(f"first blocks' parent {e['parent_block_hash']}, expected None")
        if e.get("token_ids") != tokens[:n]:
            problems.append(f"token_ids {e.get('token_ids')}, expected {tokens[:n]}")
        if e.get("block_size") != block_size:
            problems.append(f"block_size {e.get('block_size')}, expected {block_size}")
        return True
    return False


def main():
    pub, replay, base_url, topic, block_size, hashes_json = sys.argv[1:]
    topic, block_size = topic.encode(), int(block_size)
    seed = os.environ.get("PYTHONHASHSEED")
    check_against_vllm(hashes_json)

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(local(pub))
    problems, seqs = [], []

    def receive_until(done, deadline):
        while time.time() < deadline:
            if not sub.poll(200):
                continue
            seq, events = decode(sub.recv_multipart(), topic, problems)
            seqs.append(seq)
            if done(events):
                return True
        return False

    # A SUB socket's subscription reaches the publisher some time after
    # connect; batches before that are not delivered to it. Warm-up prompts
    # (each new, so each stores a block) until one batch arrives.
    deadline = time.time() + TIMEOUT_S
    for i in range(1, 100):
        complete(base_url, [200 + i] * block_size)
        if receive_until(lambda events: True, min(deadline, time.time() + 0.5)):
            break
    else:
        sys.exit("no KV events batch reached the subscriber")

    # Three full blocks and a partial one: the full ones are cached.
    tokens = [(7 * i + 3) % 190 + 1 for i in range(3 * block_size + 5)]
    want = block_hashes(tokens, block_size, seed)
    complete(base_url, tokens)
    if not receive_until(
        lambda events: finds(events, want, tokens, block_size, problems),
        time.time() + TIMEOUT_S,
    ):
        problems.append(f"no BlockStored with the prompt's hashes {want} on PUB")
    if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
        problems.append(f"PUB sequence numbers not increasing: {seqs}")

    # Replay: every batch still buffered, from seq 0.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(local(replay))
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    found_in_replay, replayed = False, []
    deadline = time.time() + TIMEOUT_S
    while True:
        if time.time() > deadline or not dealer.poll(int(TIMEOUT_S * 1000)):
            problems.append("replay did not end with the end marker")
            break
        frames = dealer.recv_multipart()
        if frames[0] != b"":
            problems.append(f"replay message without the empty delimiter: {frames!r}")
            break
        if frames[1:] == [b"", (-1).to_bytes(8, "big", signed=True), b""]:
            break
        seq, events = decode(frames[1:], topic, problems)
        replayed.append(seq)
        found_in_replay |= finds(events, want, tokens, block_size, problems)
    if not found_in_replay:
        problems.append(f"no BlockStored with the prompt's hashes {want} in the replay")
    if replayed[:1] != [0] or replayed != list(range(len(replayed))):
        problems.append(f"replayed sequence numbers {replayed}, expected 0, 1, 2, ...")

    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"ok: {len(seqs)} batches on PUB, {len(replayed)} replayed, hashes {want}")


if __name__ == "__main__":
    main()
