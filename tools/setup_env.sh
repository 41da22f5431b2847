#!/usr/bin/env bash
# Create (or refresh) .venv at the repository root with the pinned development stack.
# Idempotent: a stamp holding the hash of the pinned inputs makes a second run take seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.mmvit_ext_stack"
want="$(cat requirements/dev.txt tools/setup_env.sh setup.py | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "[setup_env] .venv is up to date ($venv)"
    exit 0
fi

[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
t0=$SECONDS
"${pip[@]}" "setuptools<70" wheel ninja
# torch first: mmcv's ops are compiled against it without build isolation.
"${pip[@]}" "torch==2.11.0" "torchvision==0.26.0" "numpy<2"
# mmcv's ops, probed by running nms on the device torch sees (a CPU-only build imports fine on a
# GPU machine and fails on the first CUDA tensor).
device="$("$venv/bin/python" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")"
probe="import torch; from mmcv.ops import nms; b = torch.tensor([[0., 0, 9, 9], [1, 1, 9, 9]], device='$device'); nms(b, torch.tensor([.9, .8], device='$device'), 0.5)"
if ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
    if [[ "$device" == cuda ]]; then
        # a wheel from tools/build_gpu_wheels.sh first; else build for this device, all cores,
        # bypassing pip's cache (it may hold a CPU-only build of the same version)
        if ! "${pip[@]}" --no-index --find-links "$root/.whl/core" --find-links "$root/.whl" --force-reinstall --no-deps "mmcv==2.1.0" 2>/dev/null \
                || ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
            command -v nvcc >/dev/null || { echo "[setup_env] error: mmcv needs CUDA ops here and no CUDA toolkit (nvcc) is on PATH; install the toolkit matching torch's CUDA ($("$venv/bin/python" -c 'import torch; print(torch.version.cuda)')), or carry the wheels of tools/build_gpu_wheels.sh in .whl/" >&2; exit 1; }
            arch="${TORCH_CUDA_ARCH_LIST:-$("$venv/bin/python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
            echo "[setup_env] building mmcv 2.1.0 with CUDA ops for sm $arch on $(nproc) cores"
            CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}" MMCV_WITH_OPS=1 FORCE_CUDA=1 \
                TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
                "${pip[@]}" --no-build-isolation --no-cache-dir --force-reinstall --no-deps "mmcv==2.1.0"
        fi
    else
        echo "[setup_env] building mmcv 2.1.0 with CPU ops (about 12 min on 2 cores the first time; pip caches the wheel)"
        MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" "${pip[@]}" --no-build-isolation "mmcv==2.1.0"
    fi
    "$venv/bin/python" -c "$probe" || { echo "[setup_env] error: mmcv's nms does not run on $device" >&2; exit 1; }
fi
"${pip[@]}" -r requirements/dev.txt
"${pip[@]}" --no-deps --no-build-isolation -e .
"$venv/bin/python" -c "import mmcv._ext, mmdet.models, mmseg.models, mmpretrain.models, mmvit_ext; print('[setup_env] stack OK: torch', __import__('torch').__version__, 'mmcv', mmcv.__version__, 'ops on $device')"
echo "$want" > "$stamp"
echo "[setup_env] done in $((SECONDS - t0)) s"
