#!/usr/bin/env bash
# A tested stack set up, then its tests: pinned|oldest|newest [--venv DIR] [pytest args...].
# Logic: tools/dev/stack_tests.py; Python (every tools/*.sh): $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/dev/stack_tests.py" "$@"
