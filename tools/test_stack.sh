#!/usr/bin/env bash
# A tested stack beside the pinned one, set up and then its tests run: oldest
# (requirements/oldest.txt: Python 3.9, torch 2.1 + mmcv 2.1.0) or newest (requirements/newest.txt:
# Python 3.12, torch 2.11 + the OneDL forks, numpy 2, transformers 5). CI runs one of them beside
# the pinned suite (.ci/run).
# usage: bash tools/test_stack.sh oldest|newest [--venv DIR] [pytest args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stack="${1:-}"
[[ "$stack" == oldest || "$stack" == newest ]] || { echo "usage: bash tools/test_stack.sh oldest|newest [--venv DIR] [pytest args...]" >&2; exit 2; }
shift
venv="$root/.venv-$stack"
if [[ "${1:-}" == --venv ]]; then venv="${2:?--venv needs a directory}"; shift 2; fi
bash tools/setup_env.sh --stack "$stack" --venv "$venv"
# the core of what a user of the stack runs: every backbone's contract, every checkpoint layout
# and load path, the installed wheel and its configs (the demo Mask R-CNN trained a step from it),
# every peer config, feature equality with the peers, and a shipped config of each task trained
# a step (Mask R-CNN also under whole-model bf16 autocast)
tests=(
    tests/test_contract.py tests/test_layouts.py tests/test_load_paths.py tests/test_packaging.py
    tests/test_peer_configs.py::test_every_candidate_config_loads
    tests/test_peer_configs.py::test_features_equal_given_peer_weights
    "tests/test_configs.py::test_config_trains_one_step_and_predicts[configs/mask_rcnn_pvtv2_b2.py]"
    "tests/test_configs.py::test_config_trains_one_step_and_predicts[configs/upernet_swin_t_512x512_160k_ade20k.py]"
    "tests/test_configs.py::test_whole_model_autocast_trains_and_predicts[configs/mask_rcnn_pvtv2_b2.py-bf16]"
)
# the newest stack adds the classifier task, timm's current models and transformers 5
[[ "$stack" == oldest ]] || tests+=(
    "tests/test_configs.py::test_config_trains_one_step_and_predicts[configs/mmpretrain/pvtv2_b0_in1k.py]"
    tests/test_timm_backbone.py tests/test_env_check.py
)
# its own temp root and no cache files: it may run beside another pytest in this checkout
basetemp="$(mktemp -d -t "mmvit_ext_$stack.XXXXXX")"
trap 'rm -rf "$basetemp"' EXIT
"$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp "$basetemp" "${tests[@]}" "$@"
