#!/usr/bin/env bash
# Create or refresh .venv with the pinned stack (--help: the other stacks); logic: tools/setup_env.py.
# $PYTHON is also the new venv's base. Python (every tools/*.sh): $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/setup_env.py" "$@"
