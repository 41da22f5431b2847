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
if ! "$venv/bin/python" -c "import mmcv, mmcv._ext" 2>/dev/null; then
    echo "[setup_env] building mmcv 2.1.0 with ops (about 12 min on 2 cores the first time; pip caches the wheel)"
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" "${pip[@]}" --no-build-isolation "mmcv==2.1.0"
fi
"${pip[@]}" -r requirements/dev.txt
"${pip[@]}" --no-deps --no-build-isolation -e .
"$venv/bin/python" -c "import mmcv._ext, mmdet.models, mmseg.models, mmpretrain.models, mmvit_ext; print('[setup_env] stack OK: torch', __import__('torch').__version__, 'mmcv', mmcv.__version__)"
echo "$want" > "$stamp"
echo "[setup_env] done in $((SECONDS - t0)) s"
