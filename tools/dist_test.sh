#!/usr/bin/env bash
# Usage: tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args...]
# Env: NNODES, NODE_RANK, MASTER_ADDR, PORT; PYTHON (default: the repository's .venv/bin/python).
set -euo pipefail
if [[ $# -lt 3 ]]; then
    echo "usage: $0 CONFIG CHECKPOINT NUM_PROCS [test.py args...]" >&2
    exit 2
fi
source "$(dirname "$0")/venv_python.sh"
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
shift 3
exec "$PYTHON" -m torch.distributed.run --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
