#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]   (torchrun; gloo on CPU, nccl on GPU)
# Env: NNODES, NODE_RANK, MASTER_ADDR, PORT (tools/launch.py); Python: $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/launch.py" dist train "$@"
