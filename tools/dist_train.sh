#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]   (torchrun; gloo on CPU, nccl on GPU)
set -euo pipefail
CONFIG=$1
NPROC=$2
shift 2
exec python -m torch.distributed.run --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "$@"
