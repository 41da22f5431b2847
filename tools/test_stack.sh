#!/usr/bin/env bash
# A tested stack beside the pinned one, set up and then its tests run (tools/stack_tests.py).
# usage: bash tools/test_stack.sh pinned|oldest|newest [--venv DIR] [pytest args...]
# Interpreter (one rule in every tools/*.sh): $PYTHON, else .venv/bin/python if it exists, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/stack_tests.py" "$@"
