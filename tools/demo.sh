#!/usr/bin/env bash
# README command 1: set up .venv (idempotent), then train and evaluate the headline model,
# Mask R-CNN + PVTv2-b2, on the built-in synthetic COCO-format demo data, and draw predictions.
# Interpreter (one rule in every tools/*.sh): $PYTHON, else .venv/bin/python if it exists, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
config=configs/demo/mask_rcnn_pvtv2_b2_demo.py
work_dir=${DEMO_WORK_DIR:-work_dirs/demo}
# bitwise reproducible on CPU; seeded only on CUDA, where mmcv's RoI ops sum gradients with atomicAdd
deterministic=$("$PY" -c 'import torch; print(not torch.cuda.is_available())')
if [[ $deterministic == False ]]; then
    echo '[demo] CUDA: seeded, not bitwise reproducible (mmcv RoI ops: atomicAdd backward)'
fi
t0=$SECONDS
"$PY" tools/make_demo_data.py --out data/demo_shapes
"$PY" tools/train.py "$config" --work-dir "$work_dir" \
    --cfg-options randomness.deterministic="$deterministic"
ckpt="$(cat "$work_dir/last_checkpoint")"
"$PY" tools/test.py "$config" "$ckpt" --work-dir "$work_dir/test" --show-dir vis \
    --cfg-options randomness.deterministic="$deterministic"
"$PY" tools/summarize_demo.py "$work_dir"
"$PY" demo/image_demo.py data/demo_shapes/val/000001.png "$config" "$ckpt" \
    --out "$work_dir/image_demo.png" --score-thr 0.3
echo "[demo] finished in $((SECONDS - t0)) s"
