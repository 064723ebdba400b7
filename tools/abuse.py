"""A small request's latency while one abusive request runs.

Usage: python3 tools/abuse.py BASE_URL MODEL TAG
  e.g. sluice serve --model crates/sluice-model/tests/data/tiny-qwen2 --port 8000 &
       python3 tools/abuse.py http://127.0.0.1:8000 tiny-qwen2 new

For each abusive request (a huge logit_bias, 10^5 stop strings with n=16,
31 prompts x n=128, one at every sluice limit), sends it in a thread and
16-token requests one after another beside it for as long as it runs;
prints the small requests' median and worst latency and the abusive
request's status and time. A baseline (no abuse) first. Standard library
only.
"""
import json, sys, threading, time, statistics, urllib.request, urllib.error

base, model, tag = sys.argv[1], sys.argv[2], sys.argv[3]

def post(body, timeout=600):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        e.read(); code = e.code
    except Exception as e:
        code = repr(e)[:60]
    return code, time.time() - t

small = {"model": model, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0, "ignore_eos": True}

def smalls(alive, k=5, limit_s=90):
    """Small requests one after another: k of them, and more while the
    abusive request is still running (at most limit_s)."""
    lat = []
    t0 = time.time()
    code = None
    while len(lat) < k or (alive() and time.time() - t0 < limit_s):
        code, dt = post(small)
        lat.append(dt)
    return statistics.median(lat) * 1000, max(lat) * 1000, len(lat), code

abusive = {
    "baseline": None,
    "logit_bias 1e5 keys": {"model": model, "prompt": "Hi", "max_tokens": 16,
                            "logit_bias": {str(i): 0.5 for i in range(100000)}},
    "1e5 stop strings, n=16": {"model": model, "prompt": "Hi", "max_tokens": 64, "n": 16,
                               "stop": ["zq%dx" % i for i in range(100000)]},
    "at the limits: 2 prompts x n=128 x 500, 1000 biases, 4 stops": {"model": model, "prompt": ["Hello there", "General Kenobi"],
        "n": 128, "max_tokens": 500, "ignore_eos": True, "temperature": 1.0,
        "logit_bias": {str(i): 0.5 for i in range(1000)}, "stop": ["zq1", "zq2", "zq3", "zq4"]},
    "31 prompts x n=128 x 500": {"model": model, "prompt": ["Hello there %d" % i for i in range(31)],
                                  "n": 128, "max_tokens": 500, "ignore_eos": True},
}
for name, body in abusive.items():
    res = {}
    th = None
    if body is not None:
        def go():
            res["abuse"] = post(body, timeout=120)
        th = threading.Thread(target=go); th.start()
        time.sleep(0.3)
    med, mx, k, code = smalls(lambda: th is not None and th.is_alive())
    if th is not None:
        th.join(timeout=900)
    a = res.get("abuse")
    print(f"{tag}\t{name}\tsmall p50 {med:.1f} ms, max {mx:.1f} ms over {k} (last status {code})\tabusive: " +
          (f"status {a[0]} in {a[1]:.2f} s" if a else "-"), flush=True)
