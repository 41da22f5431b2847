# Sourced by the launch scripts: PYTHON is $PYTHON if set, else the repository's .venv python
# (tools/setup_env.sh creates it; a bare `python` on a fresh machine has no torch).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
if [[ ! -x "$PYTHON" ]]; then
    echo "no python at $PYTHON: run tools/setup_env.sh, or set PYTHON=/path/to/python" >&2
    exit 2
fi
