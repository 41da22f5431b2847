#!/usr/bin/env bash
# The GPU check in one call (<= 6 min on an H100): installs what is missing from carried wheels,
# then runs each step in its own process (a failure or an OOM costs only its own row) and writes
# one markdown table (--out, rewritten before every row, so a run killed at a time limit keeps the
# rows it finished) plus one tarball of every log beside it.
#
# Steps, in this order (most value per second first, the OOM-prone last):
#   probe      mmcv's nms / RoIAlign / mask-target crop run on the device (tools/analysis/ops_probe.py)
#   contract   the backbone contract on the device, fp32 / bf16 / fp16 (tools/analysis/device_check.py)
#   amp-train  Mask R-CNN PVTv2-b2, 2 iterations through tools/train.py --amp, bf16 and fp16
#   ddp        the same through torchrun (1 process) and mmengine's DDP wrapper
#   fsdp       the same through mmengine's FlexibleRunner + FSDPStrategy, bf16 parameters
#   bench      bf16 fwd+bwd, 800x1344, Swin-T and PVTv2-b2 against mmdet and timm (benchmark.py)
#   ladder     the Swin-L memory ladder, 800x1333, ours and mmdet at equal dtypes (memory_ladder.py)
# --device cpu runs the same steps at tiny settings (tests/test_gpu_check.py runs it).
#
# Usage: bash tools/gpu_check.sh [--device cuda|cpu] [--out FILE] [--steps a,b,...] [--no-install]
#   --out FILE      the table (default work_dirs/gpu_check/gpu_check.md); logs in FILE's folder
#                   under logs/, all of them also in FILE minus .md plus _logs.tar.gz
#   --steps LIST    only these steps (comma-separated, e.g. --steps bench,ladder to rerun two)
#   --no-install    use the Python environment as it is (no pip)
#   Env: PYTHON (default .venv/bin/python, else python3); BENCH_BATCH (default 8).
#   Install (CUDA, unless --no-install): each wheel set of tools/build_gpu_wheels.sh found in
#   .whl/SET/ (pip --no-index --no-deps); without any, mmcv 2.1.0 built with CUDA ops
#   (TORCH_CUDA_ARCH_LIST from the device, MAX_JOBS = all cores) and the pinned stack from PyPI.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ALL_STEPS=(probe contract amp-train ddp fsdp bench ladder)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
DEVICE=cuda
OUT=work_dirs/gpu_check/gpu_check.md
STEPS="$(IFS=,; echo "${ALL_STEPS[*]}")"
INSTALL=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) DEVICE="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
if [[ "$DEVICE" != cuda && "$DEVICE" != cpu ]]; then
    echo "gpu_check: --device must be cuda or cpu, got $DEVICE" >&2; exit 2
fi
for s in ${STEPS//,/ }; do
    [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || { echo "gpu_check: unknown step $s (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
done
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ "$DEVICE" == cuda ]] && ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible to $PYTHON (torch.cuda.is_available() is False); nothing checked (--device cpu runs the CPU variant)"
    exit 1
fi

OUT_DIR="$(dirname "$OUT")"
LOGS="$OUT_DIR/logs"
mkdir -p "$LOGS"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # mmvit_ext from this checkout, no install
CUDA_DEV=$([[ "$DEVICE" == cuda ]] && echo 1 || echo 0)
pick() { if [[ $CUDA_DEV == 1 ]]; then echo "$1"; else echo "$2"; fi; }  # pick CUDA CPU

install_stack() {  # only what is missing; torch and torchvision are the machine's own
    local pip=("$PYTHON" -m pip install --disable-pip-version-check -q) sets
    sets=("$ROOT"/.whl/*/requirements.txt)
    if [[ -f "${sets[0]}" ]]; then  # the sets of tools/build_gpu_wheels.sh carried here
        for req in "${sets[@]}"; do  # --no-deps: the sets are complete (headless opencv)
            echo "[gpu_check] installing $(dirname "$req")"
            "${pip[@]}" --no-index --no-deps --find-links "$(dirname "$req")" -r "$req" || return 1
        done
        return
    fi
    if ! "$PYTHON" tools/analysis/ops_probe.py --device cuda > "$LOGS/install_probe.log" 2>&1; then
        local arch
        arch="${TORCH_CUDA_ARCH_LIST:-$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
        echo "[gpu_check] building mmcv 2.1.0 with CUDA ops for $arch"
        "${pip[@]}" "setuptools<70" wheel ninja || return 1
        MMCV_WITH_OPS=1 FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
            "${pip[@]}" --no-build-isolation --no-cache-dir --force-reinstall --no-deps "mmcv==2.1.0" || return 1
    fi
    grep -v -E '^(torch|torchvision)==' requirements/dev.txt > "$LOGS/requirements.txt"
    "${pip[@]}" -r "$LOGS/requirements.txt"
}

ROWS=()
FAILED=0
row() {  # row NAME COMMAND...: run in its own process, log, add a row with its summary lines
    local name="$1"; shift
    local log="$LOGS/$(echo "$name" | tr ' /:' '___').log" start=$SECONDS rc summary
    echo "[gpu_check] $name: $*"
    write_table "running: $name (the rows above are done; a table that ends here was cut short)"
    "$@" > "$log" 2>&1
    rc=$?
    summary="$(grep -E '^(PROBE|CONTRACT|SUMMARY|GOAL|TRAIN)' "$log" | tail -n 3 | tr '\n' ' ' | sed 's/|/\\|/g')"
    if [[ $rc -ne 0 ]]; then
        FAILED=1
        grep -q -E 'out of memory|OutOfMemoryError' "$log" && summary="OOM. $summary"
        summary="FAILED (exit $rc, $(basename "$log")): $(tail -n 1 "$log" | cut -c1-300 | sed 's/|/\\|/g') $summary"
    fi
    ROWS+=("| $name | $([[ $rc -eq 0 ]] && echo ok || echo FAILED) | $summary | $((SECONDS - start)) |")
}

write_table() {  # write_table STATUS: the table so far, written before every row and at the end
    {
        echo "# gpu_check ($DEVICE): $(date -u '+%Y-%m-%d %H:%M UTC'), $DESC, steps $STEPS, $((SECONDS - START)) s"
        echo
        echo "| step | result | summary | seconds |"
        echo "|---|---|---|---|"
        printf '%s\n' "${ROWS[@]}"
        echo
        echo "$1"
        [[ -f "$LOGS/ladder.md" ]] && { echo; cat "$LOGS/ladder.md"; }
    } > "$OUT"
}

DATA="$LOGS/demo_shapes"
demo_data() {  # 4 training and 2 validation images at the training size, once
    [[ -f "$DATA/annotations/instances_val.json" ]] && return 0
    local size; size=$(pick 800 64)
    "$PYTHON" tools/make_demo_data.py --out "$DATA" --num-train 4 --num-val 2 --size "$size" "$size"
}

check_losses() {  # check_losses WORK_DIR: exactly 2 logged, finite losses
    "$PYTHON" - "$1" <<'EOF'
import glob, json, math, sys
logs = sorted(glob.glob(f'{sys.argv[1]}/*/vis_data/scalars.json'))
losses = [json.loads(line)['loss'] for line in open(logs[-1]) if '"loss"' in line] if logs else []
ok = len(losses) == 2 and all(math.isfinite(v) for v in losses)
print(f'TRAIN 2 iterations, losses {[round(v, 3) for v in losses]}: {"finite" if ok else "NOT finite"}')
sys.exit(0 if ok else 1)
EOF
}

train() {  # train NAME LAUNCH... -- EXTRA_ARGS...: 2 iterations (batch 2) of the demo Mask R-CNN
    local work="$LOGS/work_$1"; shift
    local launch=() extra=()
    while [[ $# -gt 0 && "$1" != -- ]]; do launch+=("$1"); shift; done
    [[ $# -gt 0 ]] && shift
    extra=("$@")
    demo_data || return 1
    local size; size=$(pick 800 64)
    "${launch[@]}" tools/train.py configs/demo/mask_rcnn_pvtv2_b2_demo.py --work-dir "$work" \
        "${extra[@]}" --cfg-options "data_root=$DATA/" "train_dataloader.dataset.data_root=$DATA/" \
        "val_dataloader.dataset.data_root=$DATA/" "test_dataloader.dataset.data_root=$DATA/" \
        "val_evaluator.ann_file=$DATA/annotations/instances_val.json" \
        "test_evaluator.ann_file=$DATA/annotations/instances_val.json" \
        "train_dataloader.dataset.pipeline.2.scale=($size,$size)" train_cfg.max_epochs=1 train_cfg.val_interval=100 \
        train_dataloader.batch_size=2 train_dataloader.num_workers=0 default_hooks.logger.interval=1 \
        default_hooks.checkpoint.interval=100 default_hooks.checkpoint.save_last=False \
        "randomness.deterministic=$(pick False True)" "${CFG_EXTRA[@]}" || return 1
    check_losses "$work"
}

torchrun() { "$PYTHON" -m torch.distributed.run --nproc_per_node 1 --master_port "$1" "${@:2}"; }

step_probe() {
    row "probe ops" "$PYTHON" tools/analysis/ops_probe.py --device "$DEVICE" --dtype bf16
}
step_contract() {
    for dtype in fp32 bf16 fp16; do
        row "contract $dtype" "$PYTHON" tools/analysis/device_check.py --device "$DEVICE" --dtype "$dtype"
    done
}
step_amp_train() {
    for dtype in bfloat16 float16; do
        [[ $CUDA_DEV == 0 && $dtype == float16 ]] && continue  # CPU AMP is bf16 (CpuAmpOptimWrapper)
        CFG_EXTRA=("optim_wrapper.dtype=$dtype")
        row "amp-train $dtype Mask R-CNN PVTv2-b2" train "amp_$dtype" "$PYTHON" -- --amp
    done
}
step_ddp() {
    CFG_EXTRA=()
    row "ddp 1 process Mask R-CNN PVTv2-b2" train ddp torchrun 29561 -- --launcher pytorch
}
step_fsdp() {
    CFG_EXTRA=(runner_type=FlexibleRunner strategy.type=FSDPStrategy
               strategy.model_wrapper.auto_wrap_policy.type=mmvit_ext.backbone_block_policy
               strategy.model_wrapper.mixed_precision.param_dtype=bfloat16
               strategy.model_wrapper.mixed_precision.reduce_dtype=float32
               strategy.model_wrapper.mixed_precision.buffer_dtype=float32)
    row "fsdp 1 process bf16 params Mask R-CNN PVTv2-b2" train fsdp torchrun 29562 -- --launcher pytorch
}
step_bench() {
    local models size batch warm rep
    models=$(pick "swin:tiny pvtv2:b2" "pvtv2:b0"); size=$(pick "800 1344" "64 64")
    batch=$(pick "${BENCH_BATCH:-8}" 1); warm=$(pick 2 0); rep=$(pick 5 1)
    for model in $models; do
        row "bench bf16 $model b$batch ${size// /x}" "$PYTHON" tools/analysis/benchmark.py "$model" \
            --device "$DEVICE" --dtype bf16 --batch "$batch" --size $size --modes fwdbwd \
            --warmup "$warm" --repeat "$rep" $(pick "--compare" "--peak-size 256")
    done
}
step_ladder() {
    if [[ $CUDA_DEV == 1 ]]; then
        row "ladder Swin-L 800x1333" "$PYTHON" tools/analysis/memory_ladder.py --device cuda \
            --arch large --size 800 1333 --repeat 3 --out "$LOGS/ladder.md"
    else
        row "ladder Swin-T 96x128" "$PYTHON" tools/analysis/memory_ladder.py --device cpu \
            --arch tiny --size 96 128 --warmup 0 --rows "ours:fp32:False" "ours:fp32:'attn'" \
            "mmdet:fp32:True" --out "$LOGS/ladder.md"
    fi
}

START=$SECONDS
DESC="$DEVICE"
if [[ $CUDA_DEV == 1 && $INSTALL == 1 ]]; then
    row "install" install_stack
fi
CFG_EXTRA=()
DESC="$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name() if '$DEVICE' == 'cuda' else 'cpu', '| torch', torch.__version__)" 2>&1 | tail -n 1)"
for s in ${STEPS//,/ }; do "step_${s//-/_}"; done

write_table "all steps done: $([[ $FAILED -eq 0 ]] && echo 'every row ok' || echo 'some rows FAILED')"
cp "$OUT" "$LOGS/"
tar -czf "${OUT%.md}_logs.tar.gz" -C "$OUT_DIR" --exclude='demo_shapes' --exclude='*.pth' logs
cat "$OUT"
exit $FAILED
