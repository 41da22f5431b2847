#!/usr/bin/env bash
# README segmentation demo: set up .venv (idempotent), write the built-in ADE20K-format demo set,
# train Semantic FPN + PVTv2-b0 on it with mmseg's loops (or the demo config given as the one
# argument, e.g. configs/demo/eomt_vit_t6_ade_demo.py), evaluate mIoU with tools/test.py
# (mmseg's IoUMetric) and draw image | ground truth | prediction for a few val images.
# Interpreter (one rule in every tools/*.sh): $PYTHON, else .venv/bin/python if it exists, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }
config=${1:-configs/demo/fpn_pvtv2_b0_ade_demo.py}
data=data/demo_ade/ADEChallengeData2016  # the demo configs' data_root
work_dir=${SEG_DEMO_WORK_DIR:-work_dirs/seg_demo${1:+_$(basename "$config" .py)}}
t0=$SECONDS
"$PY" tools/make_ade_demo_data.py --out "$data"
"$PY" tools/train.py "$config" --work-dir "$work_dir"
ckpt="$(cat "$work_dir/last_checkpoint")"
"$PY" tools/test.py "$config" "$ckpt" --work-dir "$work_dir/test" \
    --cfg-options test_dataloader.dataset.data_root="$data"
"$PY" tools/summarize_seg_demo.py "$config" "$ckpt" "$work_dir" --num 4
echo "[seg demo] finished in $((SECONDS - t0)) s"
