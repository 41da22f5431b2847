#!/usr/bin/env bash
# The GPU check in one call: [--device cuda|cpu] [--out FILE] [--steps a,b] [--install]; --help.
# Logic: tools/dev/gpu_check.py. Python (every tools/*.sh; the steps too): $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/dev/gpu_check.py" "$@"
