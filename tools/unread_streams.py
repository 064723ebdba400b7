"""8 clients that never read their streams: the server's RSS before and
after, and whether it aborts them.

Usage: python3 tools/unread_streams.py PATH/TO/sluice PORT
Starts `sluice serve` (built-in model, --kv-cache-memory 64MiB), sends 8
streamed completions (n=128, 2000 tokens) whose sockets are never read,
waits until the engine is idle (at most 300 s), prints the RSS, the
statuses and the number of "aborting request" log lines. Linux only
(/proc), standard library only.
"""
import json, socket, sys, time, urllib.request, subprocess, re
binary, port = sys.argv[1], int(sys.argv[2])
import tempfile
log_path = tempfile.mktemp(suffix=".log")
log = open(log_path, "w")
srv = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--threads", "2",
                        "--kv-cache-memory", "64MiB"], stderr=log)
base = f"http://127.0.0.1:{port}"
for _ in range(200):
    try:
        urllib.request.urlopen(base + "/health", timeout=1); break
    except Exception: time.sleep(0.1)
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{srv.pid}/status").read()).group(1)) / 1024
def metric(name):
    t = urllib.request.urlopen(base + "/metrics").read().decode()
    for l in t.splitlines():
        if l.startswith(name) and not l.startswith("#"):
            return float(l.rsplit(" ", 1)[1])
before = rss()
body = json.dumps({"prompt": "Once upon a time", "n": 128, "max_tokens": 2000, "stream": True, "ignore_eos": True, "temperature": 1.0})
socks = []
for i in range(8):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    socks.append(s)
time.sleep(2)
t0 = time.time()
while time.time() - t0 < 300:
    if metric("vllm:num_requests_running") == 0 and metric("vllm:num_requests_waiting") == 0:
        break
    time.sleep(0.5)
after = rss()
print(f"{binary}: RSS {before:.0f} MiB before, {after:.0f} MiB with 8 unread streams done ({time.time()-t0:.0f} s), kv {metric('vllm:kv_cache_usage_perc')}")
codes = []
for s_ in socks:
    s_.settimeout(2)
    try:
        codes.append(s_.recv(12).decode(errors="replace")[9:12])
    except Exception as e:
        codes.append("?")
print("statuses:", codes)
srv.terminate()
try:
    srv.wait(timeout=10)
except subprocess.TimeoutExpired:
    print("did not exit within 10 s of SIGTERM; killed")
    srv.kill(); srv.wait()
log.close()
print("aborted:", open(log_path).read().count("aborting request"))
