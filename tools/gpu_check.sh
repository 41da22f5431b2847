#!/usr/bin/env bash
# The GPU check in one call: bash tools/gpu_check.sh [--device cuda|cpu] [--out FILE] [--steps a,b]
# [--install]; --help lists the steps. The logic is tools/gpu_check.py, run on $PYTHON, else
# .venv/bin/python, else python3 (the steps run on the same interpreter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-$([[ -x .venv/bin/python ]] && echo "$PWD/.venv/bin/python" || echo python3)}"
exec "$PY" tools/gpu_check.py "$@"
