#!/usr/bin/env bash
# The oldest tested stack (requirements/oldest.txt: Python 3.9, torch 2.1 + mmcv 2.1.0): set it up, then run
# the tests that state what works there. CI runs this beside the pinned suite (.ci/run).
# usage: bash tools/test_oldest.sh [--venv DIR] [pytest args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-oldest"
if [[ "${1:-}" == --venv ]]; then venv="${2:?--venv needs a directory}"; shift 2; fi
bash tools/setup_env.sh --stack oldest --venv "$venv"
# the core of what a user of this stack runs: every backbone's contract, every checkpoint layout
# and load path, the installed wheel and its configs, every peer config, feature equality with
# the peers, and Mask R-CNN / UperNet training (whole-model bf16 autocast included)
tests=(
    tests/test_contract.py tests/test_layouts.py tests/test_load_paths.py tests/test_packaging.py
    tests/test_peer_configs.py::test_every_candidate_config_loads
    tests/test_peer_configs.py::test_features_equal_given_peer_weights
    "tests/test_configs.py::test_config_trains_one_step_and_predicts[configs/mask_rcnn_pvtv2_b2.py]"
    "tests/test_configs.py::test_config_trains_one_step_and_predicts[configs/upernet_swin_t_512x512_160k_ade20k.py]"
    "tests/test_configs.py::test_whole_model_autocast_trains_and_predicts[configs/mask_rcnn_pvtv2_b2.py-bf16]"
)
# its own temp root and no cache files: it may run beside another pytest in this checkout
basetemp="$(mktemp -d -t mmvit_ext_oldest.XXXXXX)"
trap 'rm -rf "$basetemp"' EXIT
"$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp "$basetemp" "${tests[@]}" "$@"
