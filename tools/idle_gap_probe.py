#!/usr/bin/env python3
"""Does a step cost more after the engine has idled? Sends single requests
to a running `sluice serve` after idle gaps of several lengths, shuffled and
interleaved with prompt sizes, and reads each request's prefill step (and
the decode steps after it) from the server's step log.

Start the server with a step log and without prefix caching (so every
prompt is computed in full), e.g.

    sluice serve --model MODEL --port 8411 --no-enable-prefix-caching \\
        --step-log steps.jsonl

then run

    tools/idle_gap_probe.py --url http://127.0.0.1:8411 --step-log steps.jsonl

Prints, per (prompt tokens, idle gap), the median prefill step time with
every sample, and the median of the three decode steps after it. Compare
the rows of one size: a cost of waking up shows as a time that grows with
the gap. Nothing else may run on the machine meanwhile.
"""

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's base URL")
    ap.add_argument("--step-log", required=True, help="the server's --step-log file")
    ap.add_argument("--sizes", default="64,400", help="prompt tokens (comma-separated)")
    ap.add_argument("--gaps", default="0,0.05,0.2,0.5,1,2", help="idle gaps in seconds")
    ap.add_argument("--reps", type=int, default=4, help="requests per (size, gap)")
    ap.add_argument("--vocab-size", type=int, default=32000,
                    help="prompt token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
        gaps = [float(x) for x in args.gaps.split(",")]
    except ValueError as e:
        sys.exit(f"--sizes/--gaps: {e}")
    if args.vocab_size <= 1000 or args.reps < 1 or min(sizes) < 1 or min(gaps) < 0:
        sys.exit("--vocab-size must exceed 1000, --reps and --sizes be positive, --gaps >= 0")
    rng = random.Random(args.seed)

    def request(n):
        prompt = [rng.randrange(1000, args.vocab_size) for _ in range(n)]
        body = json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0,
                           "ignore_eos": True}).encode()
        r = urllib.request.Request(args.url + "/v1/completions", body,
                                   {"content-type": "application/json"})
        try:
            urllib.request.urlopen(r).read()
        except OSError as e:
            sys.exit(f"{args.url}: {e}")

    for n in sizes * 2:  # warm-up
        request(n)
    sent = []
    for _ in range(args.reps):
        order = [(g, n) for g in gaps for n in sizes]
        rng.shuffle(order)
        for g, n in order:
            time.sleep(g)
            request(n)
            sent.append((n, g))
    time.sleep(2.5)  # the step log is flushed each second and when idle

    try:
        steps = [json.loads(line) for line in open(args.step_log)]
    except (OSError, ValueError) as e:
        sys.exit(f"{args.step_log}: {e}")
    prefills = [i for i, s in enumerate(steps) if s["num_prefill_reqs"]][-len(sent):]
    if len(prefills) != len(sent):
        sys.exit(f"{args.step_log}: {len(prefills)} prefill steps for {len(sent)} requests")
    by_point = {}
    for i, (n, g) in zip(prefills, sent):
        s = steps[i]
        if s["prefill_tokens"] != n or s["num_reqs"] != 1:
            sys.exit(f"{args.step_log}: step {s['step']} is not one {n}-token prefill "
                     "(was something else sent to the server, or prefix caching on?)")
        after = [steps[j]["step_s"] for j in range(i + 1, min(i + 4, len(steps)))]
        by_point.setdefault((n, g), []).append((s["step_s"], after))
    print("| prompt tokens | idle gap s | prefill step ms, median [samples] | decode step after, ms |")
    print("|---|---|---|---|")
    for (n, g), v in sorted(by_point.items()):
        pre = [1e3 * t for t, _ in v]
        dec = [1e3 * statistics.mean(a) for _, a in v if a]
        dec_ms = f"{statistics.median(dec):.2f}" if dec else "-"
        samples = " ".join(f"{x:.0f}" for x in pre)
        print(f"| {n} | {g:g} | {statistics.median(pre):.1f} [{samples}] | {dec_ms} |")


if __name__ == "__main__":
    main()
