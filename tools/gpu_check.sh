#!/usr/bin/env bash
# The GPU check in one call: bash tools/gpu_check.sh [--device cuda|cpu] [--out FILE] [--steps a,b]
# [--install]; --help lists the steps. The logic is tools/gpu_check.py; the steps run on $PY too.
# Interpreter (one rule in every tools/*.sh): $PYTHON, else .venv/bin/python if it exists, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/gpu_check.py" "$@"
