#!/usr/bin/env bash
# Create (or refresh) a venv with one tested stack: .venv with the pinned development stack
# (requirements/dev.txt), or with --stack oldest / newest .venv-oldest / .venv-newest
# (requirements/oldest.txt / newest.txt).
# Idempotent: a stamp holding the hash of the pinned inputs makes a second run take seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
usage() {
    cat <<'USAGE'
usage: bash tools/setup_env.sh [--stack pinned|oldest|newest] [--venv DIR]

  --stack pinned  requirements/dev.txt into .venv (default; the README's stack)
  --stack oldest  requirements/oldest.txt (torch 2.1 + mmcv 2.1.0) into .venv-oldest; mmcv is
                  compiled against that torch and its wheel kept in
                  ${XDG_CACHE_HOME:-~/.cache}/mmvit_ext/mmcv/KEY (KEY names mmcv, torch, device,
                  Python), never in pip's cache, where it would collide with the pinned build
  --stack newest  requirements/newest.txt (torch 2.11 + the OneDL forks) into .venv-newest;
                  onedl-mmcv compiled and cached as the oldest stack's mmcv
  --venv DIR      the venv to create or refresh instead of the stack's default
Environment: PYTHON (the interpreter for a new venv; default: the requirements file's
"# python: X.Y" line, looked up as pythonX.Y on the PATH or under pyenv, else python3), MAX_JOBS (compile jobs,
default: all cores), TORCH_CUDA_ARCH_LIST (CUDA archs, default: the device's).
USAGE
}
stack=pinned
venv=""
while (($#)); do
    case "$1" in
        --stack) stack="${2:-}"; shift 2 || { usage >&2; exit 2; } ;;
        --venv) venv="${2:-}"; shift 2 || { usage >&2; exit 2; } ;;
        -h|--help) usage; exit 0 ;;
        *) echo "[setup_env] unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$stack" in
    pinned) reqs=requirements/dev.txt; venv="${venv:-$root/.venv}" ;;
    oldest|newest) reqs=requirements/$stack.txt; venv="${venv:-$root/.venv-$stack}" ;;
    *) echo "[setup_env] --stack must be pinned, oldest or newest, got '$stack'" >&2; exit 2 ;;
esac
# the stack's Python: PYTHON, else the requirements file's "# python: X.Y" (on the PATH, or a
# pyenv install), else python3
want_py="$(sed -n -E 's/^# python: *([0-9]+\.[0-9]+).*/\1/p' "$reqs")"
py="${PYTHON:-python3}"
if [[ -z "${PYTHON:-}" && -n "$want_py" ]]; then
    py=""
    pyenv_root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
    for candidate in "python$want_py" "$pyenv_root/versions/$want_py"*/bin/"python$want_py"; do
        if "$candidate" -c '' 2>/dev/null; then py="$candidate"; break; fi
    done
    [[ -n "$py" ]] || { echo "[setup_env] error: the $stack stack runs on Python $want_py ($reqs); no python$want_py found on the PATH or under pyenv; install it or set PYTHON" >&2; exit 1; }
fi
stamp="$venv/.mmvit_ext_stack"
want="$(cat "$reqs" tools/setup_env.sh setup.py | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "[setup_env] .venv is up to date ($venv)"
    exit 0
fi

# a venv of another Python is made anew
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
have_py="$(py_version "$venv/bin/python" || true)"
[[ -z "$have_py" || "$have_py" == "$(py_version "$py")" ]] || rm -rf "$venv"
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
t0=$SECONDS
# the build tools of its mmcv ("# build:" line; mmcv 2.1.0's setup.py needs setuptools < 70),
# and its mmcv: the file's (onedl-)mmcv pin, else mmcv 2.1.0
read -r -a tools < <(sed -n -E 's/^# build: *([^(]*).*/\1/p' "$reqs"; echo "setuptools<70 wheel ninja")
read -r mmcv_dist mmcv_ver < <(sed -n -E 's/^((onedl-)?mmcv)==([^[:space:]#]+).*/\1 \3/p' "$reqs"; echo mmcv 2.1.0)
mmcv="$mmcv_dist==$mmcv_ver"
# its ops' build: all cores, no debug info (-g0 halves the compile's CPU time against torch 2.11;
# CPPFLAGS, which distutils appends to Python's "-g -O3", where a CFLAGS would replace them)
build=(env MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" CPPFLAGS="${CPPFLAGS:-} -g0")
"${pip[@]}" "${tools[@]}"
# torch first (the stack's torch / torchvision / numpy lines): mmcv's ops are compiled against it
# without build isolation.
mapfile -t base < <(sed -n -E 's/[[:space:]]*#.*//; /^(torch|torchvision|numpy)([=<>!~ ]|$)/p' "$reqs")
"${pip[@]}" "${base[@]}"
# mmcv's ops, probed by running nms on the device torch sees (a CPU-only build imports fine on a
# GPU machine and fails on the first CUDA tensor).
device="$("$venv/bin/python" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")"
probe="import torch; from mmcv.ops import nms; b = torch.tensor([[0., 0, 9, 9], [1, 1, 9, 9]], device='$device'); nms(b, torch.tensor([.9, .8], device='$device'), 0.5)"
if ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
    if [[ "$device" == cuda ]]; then
        # a wheel from tools/build_gpu_wheels.sh first; else build for this device, all cores,
        # bypassing pip's cache (it may hold a CPU-only build of the same version)
        if ! "${pip[@]}" --no-index --find-links "$root/.whl/core" --find-links "$root/.whl" --force-reinstall --no-deps "$mmcv" 2>/dev/null \
                || ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
            command -v nvcc >/dev/null || { echo "[setup_env] error: mmcv needs CUDA ops here and no CUDA toolkit (nvcc) is on PATH; install the toolkit matching torch's CUDA ($("$venv/bin/python" -c 'import torch; print(torch.version.cuda)')), or carry the wheels of tools/build_gpu_wheels.sh in .whl/" >&2; exit 1; }
            arch="${TORCH_CUDA_ARCH_LIST:-$("$venv/bin/python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
            echo "[setup_env] building $mmcv with CUDA ops for sm $arch on $(nproc) cores"
            "${build[@]}" CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}" FORCE_CUDA=1 \
                TORCH_CUDA_ARCH_LIST="$arch" "${pip[@]}" --no-build-isolation --no-cache-dir --force-reinstall --no-deps "$mmcv"
        fi
    elif [[ "$stack" == pinned ]]; then
        echo "[setup_env] building $mmcv with CPU ops (about 12 min on 2 cores the first time; pip caches the wheel)"
        "${build[@]}" "${pip[@]}" --no-build-isolation "$mmcv"
    else
        key="$("$venv/bin/python" -c 'import sys, torch; print("%s-torch%s-cpu-py%d%d" % (sys.argv[1], torch.__version__.split(chr(43))[0], *sys.version_info[:2]))' "$mmcv_dist$mmcv_ver")"
        cache="${XDG_CACHE_HOME:-$HOME/.cache}/mmvit_ext/mmcv/$key"
        name="${mmcv_dist//-/_}-$mmcv_ver"  # its wheels: "$cache/$name"-*.whl
        if ! compgen -G "$cache/$name-*.whl" >/dev/null; then
            echo "[setup_env] building $mmcv with CPU ops against this torch ($key; about 12 min on 2 cores, then cached in $cache)"
            mkdir -p "$cache.tmp"
            "${build[@]}" "$venv/bin/python" -m pip wheel -q \
                --disable-pip-version-check --no-build-isolation --no-cache-dir --no-deps \
                "$mmcv" -w "$cache.tmp"
            rm -rf "$cache" && mv "$cache.tmp" "$cache"
        fi
        "${pip[@]}" --no-deps --force-reinstall "$cache/$name"-*.whl  # this build, then
        "${pip[@]}" "$cache/$name"-*.whl "${base[@]}"                  # its dependencies
    fi
    "$venv/bin/python" -c "$probe" || { echo "[setup_env] error: mmcv's nms does not run on $device" >&2; exit 1; }
fi
"${pip[@]}" -r "$reqs"
"${pip[@]}" --no-deps --no-build-isolation -e .
"$venv/bin/python" -c "import mmcv._ext, mmdet.models, mmseg.models, mmpretrain.models, mmvit_ext; print('[setup_env] $stack stack OK: torch', __import__('torch').__version__, 'mmcv', mmcv.__version__, 'ops on $device')"
echo "$want" > "$stamp"
echo "[setup_env] done in $((SECONDS - t0)) s"
