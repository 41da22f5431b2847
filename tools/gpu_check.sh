#!/usr/bin/env bash
# The GPU check in one command: on a CUDA machine with torch + torchvision it installs what is
# missing (the pinned OpenMMLab stack from wheels in .whl/ or PyPI, mmcv 2.1.0 with CUDA ops),
# then runs and tabulates (one markdown table, --out):
#   1. the backbone contract on the device, fp32 / bf16 / fp16 (tools/analysis/device_check.py)
#   2. bf16 fwd+bwd, batch 16, 800x1344, Swin-T and PVTv2-b2 against mmdet and timm
#      (tools/analysis/benchmark.py --compare: % of the measured bf16 matmul peak, peak memory)
#   3. the memory ladder, Mask R-CNN Swin-L 800x1333 (tools/analysis/memory_ladder.py)
#   4. a 2-iteration Mask R-CNN PVTv2-b2 --amp training run on the demo data (tools/train.py)
# Without CUDA it says so in one line (exit 1); --device cpu runs the same steps on CPU at tiny
# settings (how the test suite runs it, tests/test_gpu_check.py).
#
# Usage: bash tools/gpu_check.sh [--device cuda|cpu] [--out FILE]
#   Env: PYTHON (default: .venv/bin/python, else python3), MAX_JOBS (mmcv build, default 16),
#   TORCH_CUDA_ARCH_LIST (default 9.0, H100 / H200).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEVICE=cuda
OUT=work_dirs/gpu_check/gpu_check.md
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) DEVICE="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        *) echo "usage: $0 [--device cuda|cpu] [--out FILE]" >&2; exit 2 ;;
    esac
done
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ "$DEVICE" == cuda ]] && ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible to $PYTHON (torch.cuda.is_available() is False); nothing checked (--device cpu runs the CPU variant)"
    exit 1
fi
if [[ "$DEVICE" != cuda && "$DEVICE" != cpu ]]; then
    echo "gpu_check: --device must be cuda or cpu, got $DEVICE" >&2
    exit 2
fi

LOGS="$(dirname "$OUT")/logs"
mkdir -p "$LOGS"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

install_stack() {  # only what is missing; torch and torchvision are the machine's own
    local pip=("$PYTHON" -m pip install --disable-pip-version-check -q)
    [[ -d "$ROOT/.whl" ]] && pip+=(--find-links "$ROOT/.whl")
    if ! "$PYTHON" -c "import mmcv._ext" 2>/dev/null; then
        echo "[gpu_check] building mmcv 2.1.0 with CUDA ops (TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0})"
        "${pip[@]}" "setuptools<70" wheel ninja
        MMCV_WITH_OPS=1 FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
            MAX_JOBS="${MAX_JOBS:-16}" "${pip[@]}" --no-build-isolation "mmcv==2.1.0" || return 1
    fi
    if ! "$PYTHON" -c "import mmdet.models, mmseg.models, mmpretrain.models, timm, pytest" 2>/dev/null; then
        grep -v -E '^(torch|torchvision)==' requirements/dev.txt > "$LOGS/requirements.txt"
        "${pip[@]}" -r "$LOGS/requirements.txt" || return 1
    fi
    "$PYTHON" -c "import mmvit_ext" 2>/dev/null || "${pip[@]}" --no-deps --no-build-isolation -e . || return 1
}

ROWS=()
FAILED=0
step() {  # step NAME COMMAND...: run, log, and add a row with the command's summary line
    local name="$1"; shift
    local log="$LOGS/$(echo "$name" | tr ' /' '__').log" start=$SECONDS rc
    echo "[gpu_check] $name: $*"
    "$@" > "$log" 2>&1
    rc=$?
    local summary
    summary="$(grep -E '^(CONTRACT|SUMMARY|GOAL|TRAIN)' "$log" | tail -n 3 | tr '\n' ' ' | sed 's/|/\\|/g')"
    [[ $rc -eq 0 ]] || { FAILED=1; summary="FAILED (exit $rc, $log): $(tail -n 1 "$log" | sed 's/|/\\|/g') $summary"; }
    ROWS+=("| $name | $([[ $rc -eq 0 ]] && echo ok || echo FAILED) | $summary | $((SECONDS - start)) |")
}

train_step() {  # 2 iterations (4 images, batch 2, 1 epoch) of Mask R-CNN PVTv2-b2 on demo data
    local work="$LOGS/train_work" scale="$1" amp="$2"
    "$PYTHON" tools/make_demo_data.py --out "$LOGS/demo_shapes" --num-train 4 --num-val 2 \
        --size "$scale" "$scale" || return 1
    "$PYTHON" tools/train.py configs/demo/mask_rcnn_pvtv2_b2_demo.py --work-dir "$work" $amp \
        --cfg-options "data_root=$LOGS/demo_shapes/" "train_dataloader.dataset.data_root=$LOGS/demo_shapes/" \
        "val_dataloader.dataset.data_root=$LOGS/demo_shapes/" "test_dataloader.dataset.data_root=$LOGS/demo_shapes/" \
        "val_evaluator.ann_file=$LOGS/demo_shapes/annotations/instances_val.json" \
        "test_evaluator.ann_file=$LOGS/demo_shapes/annotations/instances_val.json" \
        train_cfg.max_epochs=1 train_cfg.val_interval=100 train_dataloader.batch_size=2 \
        train_dataloader.num_workers=0 default_hooks.logger.interval=1 \
        default_hooks.checkpoint.interval=100 || return 1
    "$PYTHON" - "$work" <<'EOF'
import glob, json, math, sys
logs = sorted(glob.glob(f'{sys.argv[1]}/*/vis_data/scalars.json'))
losses = [json.loads(line)['loss'] for line in open(logs[-1]) if '"loss"' in line]
ok = len(losses) == 2 and all(math.isfinite(v) for v in losses)
print(f'TRAIN 2 iterations, losses {[round(v, 3) for v in losses]}: {"finite" if ok else "NOT finite"}')
sys.exit(0 if ok else 1)
EOF
}

START=$SECONDS
if [[ "$DEVICE" == cuda ]]; then
    install_stack || { echo "gpu_check: installing the stack failed" >&2; exit 1; }
    for dtype in fp32 bf16 fp16; do
        step "contract $dtype" "$PYTHON" tools/analysis/device_check.py --device cuda --dtype "$dtype"
    done
    for model in swin:tiny pvtv2:b2; do
        step "bf16 $model b16 800x1344" "$PYTHON" tools/analysis/benchmark.py "$model" --device cuda \
            --dtype bf16 --batch 16 --size 800 1344 --modes fwdbwd --compare
    done
    step "memory ladder Swin-L 800x1333" "$PYTHON" tools/analysis/memory_ladder.py --device cuda \
        --arch large --size 800 1333 --repeat 3 --out "$LOGS/ladder.md"
    step "Mask R-CNN PVTv2-b2 --amp 2 iters" train_step 800 --amp
else  # the same steps, tiny
    step "contract fp32" "$PYTHON" tools/analysis/device_check.py --device cpu --dtype fp32
    step "bf16 pvtv2:b0 b1 64x64" "$PYTHON" tools/analysis/benchmark.py pvtv2:b0 --device cpu \
        --dtype bf16 --batch 1 --size 64 64 --modes fwdbwd --warmup 0 --repeat 1
    step "memory ladder Swin-T 96x128" "$PYTHON" tools/analysis/memory_ladder.py --device cpu \
        --arch tiny --size 96 128 --warmup 0 --rows "ours:fp32:False" "ours:fp32:'attn'" \
        "mmdet:fp32:True" --out "$LOGS/ladder.md"
    step "Mask R-CNN PVTv2-b2 2 iters" train_step 64 ""
fi

DESC="$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name() if '$DEVICE' == 'cuda' else 'cpu', '| torch', torch.__version__)")"
{
    echo "# gpu_check ($DEVICE): $(date -u '+%Y-%m-%d %H:%M UTC'), $DESC, $((SECONDS - START)) s"
    echo
    echo "| step | result | summary | seconds |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    [[ -f "$LOGS/ladder.md" ]] && { echo; cat "$LOGS/ladder.md"; }
} > "$OUT"
cat "$OUT"
exit $FAILED
