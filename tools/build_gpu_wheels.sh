#!/usr/bin/env bash
# Docs command: build the offline wheel set of a machine without a package index into .whl/
# (--help: the options). The logic is tools/build_gpu_wheels.py (standard library only).
# Interpreter (one rule in every tools/*.sh): $PYTHON, else .venv/bin/python if it exists, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/build_gpu_wheels.py" "$@"
