#!/usr/bin/env bash
# Usage: tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# Env: GPUS (8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (tools/launch.py); Python: $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
exec "$PY" "$ROOT/tools/launch.py" slurm train "$@"
