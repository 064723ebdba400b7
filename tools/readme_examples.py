#!/usr/bin/env python3
"""Runs every shell and Python example of a Markdown file (README.md), as
written, so that none can rot.

Each fenced block whose language is `sh` or `python` runs from the
repository root; `cargo run --release [-q] --` and `./target/release/sluice`
in a shell block become the binary given with --bin (so CI runs the build it
has). What a block is, an HTML comment on the line just above it says:

    <!-- example: run -->              (the default) must exit 0
    <!-- example: run timeout=600 -->  the same, with its own time limit (s)
    <!-- example: run expect=Paris --> and its output must contain `Paris`
    <!-- example: server -->           starts a server in the background (one
                                       command); the run waits for its
                                       /health (port from --port, else 8000)
                                       and stops it at the next server block
                                       or at the end
    <!-- example: skip REASON -->      not run; the reason is printed (and
                                       must be given)

A block that fails prints its output and the run exits 1 after trying the
rest; a directive the runner does not know is an error. Python blocks run
with the interpreter given by --python, each on its own (every block must
carry its own imports).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

FENCE = re.compile(r"^```(\w+)?\s*$")
DIRECTIVE = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->\s*$")
CARGO_RUN = re.compile(r"cargo run --release(?: -q)? --")


class Block:
    def __init__(self, lang, line, text, directive):
        self.lang = lang
        self.line = line
        self.text = text
        self.directive = directive


def blocks(path):
    """The fenced sh/python blocks of `path`, with their directives."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1) or "", i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j == len(lines):
            sys.exit(f"{path}:{start + 1}: a fence that is never closed")
        if lang in ("sh", "python"):
            d = DIRECTIVE.match(lines[start - 1]) if start > 0 else None
            directive = d.group(1) if d else "run"
            out.append(Block(lang, start + 1, "\n".join(lines[i + 1 : j]) + "\n", directive))
        i = j + 1
    return out


def parse_directive(block):
    """(kind, options) of a block's directive."""
    words = block.directive.split(None, 1)
    kind = words[0] if words else "run"
    rest = words[1] if len(words) > 1 else ""
    if kind == "skip":
        if not rest:
            raise ValueError("a skipped example must say why")
        return kind, {"reason": rest}
    if kind in ("run", "server"):
        opts = {}
        for item in rest.split():
            key, _, value = item.partition("=")
            if key == "timeout" and value.isdigit():
                opts["timeout"] = int(value)
            elif key == "expect" and value and kind == "run":
                opts["expect"] = value
            else:
                raise ValueError(f"unknown option {item!r}")
        return kind, opts
    raise ValueError(f"unknown directive {kind!r} (run, server or skip)")


def shell_text(block, binary):
    text = CARGO_RUN.sub(binary, block.text)
    return text.replace("./target/release/sluice", binary)


class Server:
    """One background server and its log."""

    def __init__(self, cmd, log_dir, line):
        self.log_path = os.path.join(log_dir, f"server-{line}.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            ["bash", "-c", "exec " + cmd.strip()],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        m = re.search(r"--port[ =](\d+)", cmd)
        self.port = int(m.group(1)) if m else 8000

    def wait_ready(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return f"the server exited with {self.proc.returncode}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return None
            except OSError:
                pass
            time.sleep(0.2)
        return f"no /health answer on port {self.port} within {timeout} s"

    def output(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def run_block(cmd, timeout):
    """(exit status or "timeout", output) of `cmd`, in a session of its own
    so that a timeout stops every process it started (a grandchild holding
    the pipes would otherwise keep the run waiting)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"timeout after {timeout} s"
        out.seek(0)
        return code, out.read().decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("markdown", help="the Markdown file (README.md)")
    ap.add_argument("--bin", required=True, help="the sluice binary to run")
    ap.add_argument("--python", default=sys.executable, help="interpreter for Python blocks")
    ap.add_argument("--timeout", type=int, default=300, help="default limit per block (s)")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"--bin {args.bin}: not an executable file")

    failures, ran, skipped = [], 0, 0
    server = None
    log_dir = tempfile.mkdtemp(prefix="readme-examples-")
    try:
        for b in blocks(args.markdown):
            where = f"{args.markdown}:{b.line}"
            try:
                kind, opts = parse_directive(b)
            except ValueError as e:
                failures.append(where)
                print(f"FAIL {where}: {e}", flush=True)
                continue
            if kind == "skip":
                skipped += 1
                print(f"skip {where}: {opts['reason']}", flush=True)
                continue
            timeout = opts.get("timeout", args.timeout)
            if kind == "server":
                if b.lang != "sh":
                    failures.append(where)
                    print(f"FAIL {where}: a server block must be sh", flush=True)
                    continue
                if server:
                    server.stop()
                server = Server(shell_text(b, binary), log_dir, b.line)
                err = server.wait_ready(timeout)
                ran += 1
                if err:
                    failures.append(where)
                    print(f"FAIL {where}: {err}\n{server.output()[-4000:]}", flush=True)
                    server.stop()
                    server = None
                else:
                    print(f"ok   {where} (server on port {server.port})", flush=True)
                continue
            if b.lang == "sh":
                cmd = ["bash", "-euo", "pipefail", "-c", shell_text(b, binary)]
            else:
                cmd = [args.python, "-c", b.text]
            t0 = time.time()
            code, out = run_block(cmd, timeout)
            ran += 1
            expect = opts.get("expect")
            if code == 0 and expect and expect not in out:
                code = f"0, but the output lacks {expect!r}"
            if code != 0:
                failures.append(where)
                print(f"FAIL {where}: exit {code}\n{b.text}---\n{out[-4000:]}", flush=True)
                if server:
                    print(f"--- server log\n{server.output()[-3000:]}", flush=True)
            else:
                print(f"ok   {where} ({time.time() - t0:.1f} s)", flush=True)
    finally:
        if server:
            server.stop()
    print(f"{ran} examples ran, {skipped} skipped, {len(failures)} failed")
    if failures:
        print("failed: " + ", ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
