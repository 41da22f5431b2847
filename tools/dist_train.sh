#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]   (torchrun; gloo on CPU, nccl on GPU)
# Env: NNODES, NODE_RANK, MASTER_ADDR, PORT; PYTHON (default: the repository's .venv/bin/python).
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 CONFIG NUM_PROCS [train.py args...]" >&2
    exit 2
fi
source "$(dirname "$0")/venv_python.sh"
CONFIG=$1
NPROC=$2
shift 2
exec "$PYTHON" -m torch.distributed.run --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
