# Sourced by the fetch scripts, from the repository root: `pip_python DIR`
# sets `python` to an interpreter whose pip can download wheels — $PYTHON,
# else the repository's .venv if it has one, else python3; one without pip
# gets a venv made under DIR (a temporary folder the caller removes).
pip_python() {
  python=${PYTHON:-}
  if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
  fi
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    echo "== $python has no pip: a temporary venv downloads the wheels"
    "$python" -m venv "$1/venv"
    python=$1/venv/bin/python
  fi
}
