#!/usr/bin/env bash
# Builds, on a CPU machine with nvcc, the offline wheel set for the GPU test machine (CPython 3.12,
# torch 2.11.0+cu130, numpy 2, timm; no package index) into .whl/:
#   - mmcv (pinned in tools/gpu_wheels.txt) compiled with CUDA ops in a cached py3.12 build venv,
#     debug info stripped, the wheel cached by (mmcv, torch, CUDA, arch list);
#   - the cp312 / py3 wheels of tools/gpu_wheels.txt (the stack the image lacks), split into sets
#     that each fit one carry (.whl/<set>/, with requirements.txt);
#   - .whl/requirements.txt (all sets) and .whl/MANIFEST.txt (file, size, sha256, CUDA + arch).
# --rehearse installs the sets with --no-index --no-deps into a fresh venv that simulates the GPU
# image, checks the imports and runs tools/gpu_check.sh --device cpu with it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIST="$ROOT/tools/gpu_wheels.txt"

usage() {
    cat <<'EOF'
usage: bash tools/build_gpu_wheels.sh [options]

Options:
  --out DIR       where the wheel set goes (default: .whl at the repo root)
  --cache DIR     build venvs, downloads and the mmcv wheel cache
                  (default: $MMVIT_GPU_BUILD_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/mmvit_ext/gpu_build)
  --rebuild       compile mmcv again even if the cached wheel for this key exists
  --rehearse      after building, install the set into a fresh venv simulating the GPU image
                  (numpy 2 and the "image" entries of tools/gpu_wheels.txt from PyPI: torch,
                  torchvision, timm, opencv, scipy, matplotlib, ...) with --no-index and check it
  --rehearse-only rehearse the set already in --out, build nothing
  --print-plan    print the settings and the mmcv cache key, then exit (no download, no build)
  -h, --help      this help

Environment:
  PYTHON312             CPython 3.12 for the venvs (default: python3.12 on PATH, else pyenv's)
  TORCH_CUDA_ARCH_LIST  CUDA archs compiled into mmcv (default: 9.0, H100 / H200)
  MAX_JOBS              parallel compile jobs (default: nproc)
  NVCC                  the nvcc to build with (default: nvcc on PATH); CUDA_HOME is its parent dir
  MMVIT_GPU_BUILD_CACHE the cache dir (see --cache)
  XDG_CACHE_HOME        base of the default cache dir
EOF
}

OUT="$ROOT/.whl"
CACHE="${MMVIT_GPU_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmvit_ext/gpu_build}"
REBUILD=0 REHEARSE=0 BUILD=1 PLAN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
        --cache) CACHE="$2"; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        --rehearse) REHEARSE=1; shift ;;
        --rehearse-only) REHEARSE=1 BUILD=0; shift ;;
        --print-plan) PLAN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build_gpu_wheels: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

pin() {  # pin NAME: the version tools/gpu_wheels.txt pins NAME to
    awk -v n="$1" '$1 ~ "^"n"==" {split($1, a, "=="); print a[2]}' "$LIST"
}
arch_key() {  # "8.0;9.0+PTX" / "8.0 9.0" -> "8.0_9.0+PTX": the arch list as one path component
    echo "$1" | tr ';, ' '___' | tr -s '_' | sed 's/^_//; s/_$//'
}
find_python312() {
    if [[ -n "${PYTHON312:-}" ]]; then echo "$PYTHON312"; return; fi
    local p
    for p in "$(command -v python3.12 2>/dev/null || true)" "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        [[ -n "$p" && -x "$p" ]] && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
            && { echo "$p"; return; }
    done
    echo "build_gpu_wheels: no CPython 3.12 found (set PYTHON312)" >&2
    return 1
}

ARCH="${TORCH_CUDA_ARCH_LIST:-9.0}"
JOBS="${MAX_JOBS:-$(nproc)}"
NVCC="${NVCC:-$(command -v nvcc 2>/dev/null || true)}"
CUDA_VERSION=none CUDA_HOME_DIR=""
if [[ -n "$NVCC" && -x "$NVCC" ]]; then
    CUDA_VERSION="$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
    # nvcc itself says where it lives (NVCC may be a wrapper script or a symlink)
    CUDA_HOME_DIR="$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p')"
    CUDA_HOME_DIR="$(cd "${CUDA_HOME_DIR:-$(dirname "$(readlink -f "$NVCC")")}/.." && pwd)"
fi
MMCV_VERSION="$(pin mmcv)" TORCH_VERSION="$(pin torch)" TORCHVISION_VERSION="$(pin torchvision)"
KEY="mmcv${MMCV_VERSION}-torch${TORCH_VERSION}-cu${CUDA_VERSION}-py312-sm$(arch_key "$ARCH")"
MMCV_CACHE="$CACHE/mmcv/$KEY"
BUILD_VENV="$CACHE/venv-build" SIM_VENV="$CACHE/venv-gpu-image" DL="$CACHE/downloads"
SETS="$(awk '!/^#/ && NF >= 2 && $2 != "image" && $2 != "build" {print $2}' "$LIST" | awk '!seen[$0]++' | paste -sd' ')"

CACHE="$(realpath -m "$CACHE")"
cd "$ROOT"  # tools/gpu_check.sh, tools/train.py and the imports of mmvit_ext run from here
if [[ $PLAN -eq 1 ]]; then
    echo "mmcv $MMCV_VERSION, torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION"
    echo "nvcc: ${NVCC:-none} (CUDA $CUDA_VERSION), CUDA_HOME: ${CUDA_HOME_DIR:-none}"
    echo "TORCH_CUDA_ARCH_LIST: $ARCH, MAX_JOBS: $JOBS"
    echo "cache key: $KEY"
    echo "mmcv cache: $MMCV_CACHE"
    echo "out: $OUT, sets: $SETS"
    exit 0
fi
[[ "$CUDA_VERSION" != none ]] || { echo "build_gpu_wheels: nvcc not found (set NVCC)" >&2; exit 1; }
PY312="$(find_python312)"
mkdir -p "$CACHE" "$DL"
log() { echo "[build_gpu_wheels $(date +%H:%M:%S)] $*"; }
quiet() {  # pip's stderr less its notes on this machine's file:// index entries and on --no-deps
    grep -v -e 'is ignored: it is neither a file nor a directory' -e "dependency resolver does not" \
        -e 'dependency conflicts' -e 'which is not installed' || true
}

make_venv() {  # make_venv DIR PIP_ARGS...: a py3.12 venv with PIP_ARGS installed, reused when unchanged
    local dir="$1"; shift
    if [[ -f "$dir/.ready" && "$(cat "$dir/.ready")" == "$*" ]]; then return; fi
    log "venv $dir: $*"
    rm -rf "$dir"
    "$PY312" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip 2> >(quiet >&2)
    "$dir/bin/pip" install -q "$@" 2> >(quiet >&2)
    echo "$*" > "$dir/.ready"
}

build_mmcv() {  # the stripped CUDA mmcv wheel for $KEY, into $MMCV_CACHE
    make_venv "$BUILD_VENV" "torch==$TORCH_VERSION" "numpy>=2,<3" "setuptools<70" wheel ninja
    local torch_cuda
    torch_cuda="$("$BUILD_VENV/bin/python" -c 'import torch; print(torch.version.cuda)')"
    [[ "${torch_cuda%%.*}" == "${CUDA_VERSION%%.*}" ]] || {
        echo "build_gpu_wheels: torch $TORCH_VERSION is built for CUDA $torch_cuda, nvcc is $CUDA_VERSION" >&2
        return 1; }
    local sp nvinc
    sp="$("$BUILD_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # the toolkit may lack cuBLAS / cuSPARSE / cuDNN headers that ATen/cuda includes: the
    # nvidia-* packages torch depends on carry them
    nvinc="$(find "$sp/nvidia" -mindepth 2 -maxdepth 3 -type d -name include | sort | paste -sd:)"
    local work="$CACHE/mmcv-work" raw="$CACHE/mmcv-raw/$KEY"
    rm -rf "$work" && mkdir -p "$work/stripped"
    # the unstripped wheel is kept per key until its stripped copy is cached, so a failure after
    # the (long) compile resumes from it; --rebuild compiles again
    if [[ $REBUILD -eq 1 || -z "$(ls "$raw"/mmcv-*.whl 2>/dev/null)" ]]; then
        log "compiling mmcv $MMCV_VERSION (CUDA $CUDA_VERSION, torch CUDA $torch_cuda, arch $ARCH, $JOBS jobs)"
        local start=$SECONDS
        rm -rf "$raw"
        CUDA_HOME="$CUDA_HOME_DIR" PATH="$CUDA_HOME_DIR/bin:$PATH" CPATH="$nvinc${CPATH:+:$CPATH}" \
            MMCV_WITH_OPS=1 FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS="$JOBS" \
            "$BUILD_VENV/bin/pip" wheel -q --no-build-isolation --no-deps "mmcv==$MMCV_VERSION" -w "$raw"
        echo "$((SECONDS - start))" > "$raw/build_seconds"
        log "mmcv compiled in $((SECONDS - start)) s"
    else
        log "resuming from the compiled, unstripped wheel in $raw (compiled in $(cat "$raw/build_seconds" 2>/dev/null || echo '?') s)"
    fi
    "$BUILD_VENV/bin/python" -m wheel unpack "$raw"/mmcv-*.whl -d "$work/unpacked" > /dev/null
    local so
    for so in "$work"/unpacked/mmcv-*/mmcv/_ext*.so; do
        local before; before="$(du -m "$so" | cut -f1)"
        strip --strip-debug "$so"
        log "strip --strip-debug $(basename "$so"): $before MB -> $(du -m "$so" | cut -f1) MB"
    done
    "$BUILD_VENV/bin/python" -m wheel pack "$work"/unpacked/mmcv-* -d "$work/stripped" > /dev/null
    rm -rf "$MMCV_CACHE" && mkdir -p "$MMCV_CACHE"
    mv "$work"/stripped/mmcv-*.whl "$MMCV_CACHE/"
    cp "$raw/build_seconds" "$MMCV_CACHE/build_seconds" 2>/dev/null || true
    rm -rf "$work" "$raw"
}

download_set() {  # download_set SET: the pinned wheels of SET for cp312 manylinux x86_64
    local reqs
    reqs="$(awk -v s="$1" '!/^#/ && $2 == s && $1 !~ /^mmcv==/ {print $1}' "$LIST")"
    [[ -n "$reqs" ]] || return 0
    # shellcheck disable=SC2086
    "$BUILD_VENV/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 --platform any \
        -d "$DL" $reqs 2> >(quiet >&2)
    local r name ver f
    for r in $reqs; do
        name="${r%%==*}" ver="${r##*==}"
        f="$(find "$DL" -maxdepth 1 -iname "$(echo "$name" | tr '-' '_')-$ver-*.whl" | head -n 1)"
        if [[ -z "$f" ]]; then  # source only (onedl-mmpretrain): a pure-Python wheel built here
            "$BUILD_VENV/bin/pip" wheel -q --no-deps -w "$DL" "$r" 2> >(quiet >&2) || true
            f="$(find "$DL" -maxdepth 1 -iname "$(echo "$name" | tr '-' '_')-$ver-py3-none-any.whl" | head -n 1)"
        fi
        [[ -n "$f" ]] || { echo "build_gpu_wheels: no wheel downloaded or built for $r" >&2; return 1; }
        cp "$f" "$OUT/$1/"
    done
}

write_manifest() {  # .whl/requirements.txt, <set>/requirements.txt, MANIFEST.txt
    local set total=0 f size ext
    : > "$OUT/requirements.txt"
    for set in $SETS; do
        awk -v s="$set" '!/^#/ && $2 == s {print $1}' "$LIST" > "$OUT/$set/requirements.txt"
        cat "$OUT/$set/requirements.txt" >> "$OUT/requirements.txt"
    done
    # what was compiled in, read from the built extension (mmcv.ops needs torch: the build venv's)
    ext="$("$BUILD_VENV/bin/python" "$ROOT/tools/mmcv_ext_info.py" --expect-cuda "$CUDA_VERSION" \
        --expect-arch "$ARCH" 2>/dev/null)" || { echo "build_gpu_wheels: ${ext:-mmcv._ext unreadable}" >&2; return 1; }
    {
        echo "# GPU wheel set: $(date -u '+%Y-%m-%d %H:%M UTC'), built by tools/build_gpu_wheels.sh"
        echo "# $ext (get_compiling_cuda_version; kernels read from the fatbinary)"
        echo "# built with TORCH_CUDA_ARCH_LIST=$ARCH, torch $TORCH_VERSION, nvcc $CUDA_VERSION; cache key $KEY"
        echo "# install one set a call: pip install --no-index --no-deps --find-links .whl/SET -r .whl/SET/requirements.txt"
        echo "# or all: pip install --no-index --no-deps$(printf ' --find-links .whl/%s' $SETS) -r .whl/requirements.txt"
        for set in $SETS; do
            local stotal=0
            echo "## set $set"
            for f in "$OUT/$set"/*.whl; do
                size=$(stat -c %s "$f")
                stotal=$((stotal + size))
                echo "$set/$(basename "$f")  $size  $(sha256sum "$f" | cut -d' ' -f1)"
            done
            echo "## set $set total: $stotal bytes ($(awk -v b=$stotal 'BEGIN {printf "%.1f", b / 1048576}') MiB)"
            total=$((total + stotal))
        done
        echo "## total: $total bytes ($(awk -v b=$total 'BEGIN {printf "%.1f", b / 1048576}') MiB)"
    } > "$OUT/MANIFEST.txt"
}

build() {
    local start=$SECONDS whl set
    if [[ $REBUILD -eq 1 || -z "$(ls "$MMCV_CACHE"/mmcv-*.whl 2>/dev/null)" ]]; then
        build_mmcv
    else
        make_venv "$BUILD_VENV" "torch==$TORCH_VERSION" "numpy>=2,<3" "setuptools<70" wheel ninja
        log "mmcv: cached wheel for $KEY"
    fi
    whl="$(ls "$MMCV_CACHE"/mmcv-*.whl)"
    # the image's own packages that mmengine imports (torch does not bring them)
    "$BUILD_VENV/bin/pip" install -q pyyaml pillow packaging 2> >(quiet >&2)
    rm -rf "$OUT" && mkdir -p "$OUT"
    for set in $SETS; do
        mkdir -p "$OUT/$set"
        download_set "$set"
        if awk -v s="$set" '$1 ~ /^mmcv==/ && $2 == s {f=1} END {exit !f}' "$LIST"; then cp "$whl" "$OUT/$set/"; fi
        # the build venv gets the set too: write_manifest reads the CUDA version through mmcv.ops
        "$BUILD_VENV/bin/pip" install -q --no-index --no-deps --force-reinstall "$OUT/$set"/*.whl 2> >(quiet >&2)
    done
    write_manifest
    log "wheel set in $OUT ($((SECONDS - start)) s):"
    grep '^##' "$OUT/MANIFEST.txt"
}

rehearse() {  # a fresh venv like the GPU image; install the set offline; imports; gpu_check --device cpu
    local py="$SIM_VENV/bin/python" set fail=0 logs="$CACHE/rehearse"
    rm -rf "$logs" && mkdir -p "$logs"
    # shellcheck disable=SC2046
    make_venv "$SIM_VENV" "numpy>=2,<3" $(awk '!/^#/ && $2 == "image" {print $1}' "$LIST")
    log "rehearse: fresh install of the set into $SIM_VENV (--no-index --no-deps)"
    "$SIM_VENV/bin/pip" uninstall -q -y $(cat "$OUT/requirements.txt" | sed 's/==.*//') 2>/dev/null || true
    for set in $SETS; do
        "$SIM_VENV/bin/pip" install -q --no-index --no-deps --find-links "$OUT/$set" \
            -r "$OUT/$set/requirements.txt" 2> >(quiet >&2)
        echo "REHEARSE install $set: ok ($(wc -l < "$OUT/$set/requirements.txt") wheels)"
    done
    "$py" - 2> "$logs/imports.log" <<'EOF' || fail=1
import importlib, sys
import numpy, torch
mods = ['cv2', 'mmcv', 'mmcv._ext', 'mmengine', 'mmengine.runner', 'mmdet.models', 'mmdet.evaluation',
        'mmseg.models', 'mmseg.evaluation', 'pycocotools.cocoeval', 'mmvit_ext']
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # report every failure, not just the first
        bad.append(f'{m}: {type(e).__name__}: {e}')
print(f'REHEARSE python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__}'
      f' (CUDA {torch.version.cuda})')
print(f'REHEARSE imports {len(mods) - len(bad)}/{len(mods)} ok' + ''.join(f'\n  {b}' for b in bad))
sys.exit(1 if bad else 0)
EOF
    "$py" tools/mmcv_ext_info.py --expect-cuda "$CUDA_VERSION" --expect-arch "$ARCH" 2>> "$logs/imports.log" \
        | sed 's/^/REHEARSE /' || fail=1
    local gpu_args=(--device cpu --out "$logs/gpu_check.md")
    grep -q -- '--no-install' "$ROOT/tools/gpu_check.sh" && gpu_args+=(--no-install)
    local start=$SECONDS
    if PYTHON="$py" bash tools/gpu_check.sh "${gpu_args[@]}" > "$logs/gpu_check.log" 2>&1; then
        echo "REHEARSE gpu_check.sh ${gpu_args[*]}: ok ($((SECONDS - start)) s)"
    else
        echo "REHEARSE gpu_check.sh ${gpu_args[*]}: FAILED (log: $logs/gpu_check.log)"; fail=1
    fi
    grep '^| [^-s]' "$logs/gpu_check.md" 2>/dev/null | grep -v '^| backbone' | sed 's/^/REHEARSE   /' || true
    seg_train "$py" "$logs/upernet" || fail=1
    echo "REHEARSE $([[ $fail -eq 0 ]] && echo ok || echo FAILED)"
    return $fail
}

seg_train() {  # seg_train PY DIR: 2 iterations (+ mIoU) of UperNet Swin-T, mmseg's loops, generated data
    local py="$1" dir="$2" ade="$2/ade" rc=0
    rm -rf "$dir" && mkdir -p "$dir"
    (export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" &&
        "$py" tools/make_ade_demo_data.py --out "$ade" --num-train 2 --num-val 1 --size 128 128 &&
        "$py" tools/train.py configs/upernet_swin_t_512x512_160k_ade20k.py --work-dir "$dir/run" \
            --cfg-options model.backbone.init_cfg=None "model.data_preprocessor.size=(128,128)" \
            "train_dataloader.dataset.data_root=$ade" "val_dataloader.dataset.data_root=$ade" \
            "test_dataloader.dataset.data_root=$ade" train_dataloader.batch_size=2 \
            train_dataloader.num_workers=0 train_dataloader.persistent_workers=False \
            "train_dataloader.dataset.pipeline.2.scale=(512,128)" \
            "train_dataloader.dataset.pipeline.3.crop_size=(128,128)" train_cfg.max_iters=2 \
            train_cfg.val_interval=100 default_hooks.logger.interval=1 \
            default_hooks.checkpoint.interval=100 default_hooks.checkpoint.save_last=False &&
        "$py" - "$dir/run" <<'EOF'
import glob, json, math, sys
logs = sorted(glob.glob(f'{sys.argv[1]}/*/vis_data/scalars.json'))
rows = [json.loads(line) for line in open(logs[-1])]
losses = [r['loss'] for r in rows if 'loss' in r]
miou = [r['mIoU'] for r in rows if 'mIoU' in r]
ok = len(losses) == 2 and all(math.isfinite(v) for v in losses) and len(miou) == 1
print(f'REHEARSE UperNet Swin-T 2 iterations, losses {[round(v, 3) for v in losses]}, val mIoU {miou}:'
      f' {"ok" if ok else "FAILED"}')
sys.exit(0 if ok else 1)
EOF
    ) > "$dir/log" 2>&1 || rc=$?
    grep '^REHEARSE' "$dir/log" || echo "REHEARSE UperNet Swin-T 2 iterations: FAILED (log: $dir/log)"
    return $rc
}

START=$SECONDS
[[ $BUILD -eq 1 ]] && build
if [[ $REHEARSE -eq 1 ]]; then mkdir -p "$CACHE/rehearse"; rehearse; fi
log "done in $((SECONDS - START)) s"
