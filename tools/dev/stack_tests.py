"""A tested stack, set up and its tests run (``bash tools/test_stack.sh``).

pinned: requirements/dev.txt (CI runs its whole suite; here the install lines of the docs);
oldest: requirements/oldest.txt (Python 3.9, torch 2.1 + mmcv 2.1.0); newest:
requirements/newest.txt (the newest torch + the OneDL forks). Each runs its subset, then the
install lines of README.md and docs/ that belong to it (tests/test_install_lines.py, for real:
new venvs, pip, the network), the newest also every extra's resolution.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import setup_env  # noqa: E402

# the core of what a user of a stack runs: every backbone's contract, every checkpoint layout and
# load path, the installed wheel and its configs (the demo Mask R-CNN trained a step from it),
# every peer config, feature equality with the peers, a shipped config of each task trained a
# step (Mask R-CNN also under whole-model bf16 autocast), and attention under bf16 / float16
# autocast (whose CPU support differs between torch versions)
CORE = (
    'tests/test_contract.py', 'tests/test_layouts.py', 'tests/test_load_paths.py',
    'tests/test_packaging.py', 'tests/test_fused_attention.py',
    'tests/test_peer_configs.py::test_every_candidate_config_loads',
    'tests/test_peer_configs.py::test_features_equal_given_peer_weights',
    'tests/test_configs.py::test_config_trains_one_step_and_predicts[configs/mask_rcnn_pvtv2_b2.py]',
    'tests/test_configs.py::test_config_trains_one_step_and_predicts'
    '[configs/upernet_swin_t_512x512_160k_ade20k.py]',
    'tests/test_configs.py::test_whole_model_autocast_trains_and_predicts'
    '[configs/mask_rcnn_pvtv2_b2.py-bf16]',
)
# the newest stack adds the classifier task, timm's current models (DINOv3 too), the known breaks
EXTRA = {
    'pinned': (),
    'oldest': (),
    'newest': (
        'tests/test_configs.py::test_config_trains_one_step_and_predicts'
        '[configs/mmpretrain/pvtv2_b0_in1k.py]',
        'tests/test_timm_backbone.py', 'tests/test_env_check.py', 'tests/test_dinov3.py',
        'tests/test_dinov3_adapter.py',
        'tests/test_benchmark.py::test_dinov3_peer_is_timms_vit_dinov3_with_our_weights',
    ),
}
# the install lines run for real (pytest --install-lines), per stack
INSTALL_LINES = {
    'pinned': ('tests/test_install_lines.py::test_a_new_environment_as_the_docs_say[pinned]',),
    'oldest': (),
    'newest': ('tests/test_install_lines.py::test_a_new_environment_as_the_docs_say[newest]',
               'tests/test_install_lines.py::test_each_extra_resolves_clear_of_the_known_breaks'),
}


def tests_of(stack: str) -> List[str]:
    """The pytest node ids a stack runs (the pinned stack's suite is CI's whole one)."""
    return [] if stack == 'pinned' else [*CORE, *EXTRA[stack]]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='bash tools/test_stack.sh', description=__doc__.split('\n')[0])
    parser.add_argument('stack', choices=tuple(EXTRA))
    parser.add_argument('--venv', type=Path, help="the stack's venv (default: .venv, .venv-STACK)")
    args, pytest_args = parser.parse_known_args(argv)
    default = '.venv' if args.stack == 'pinned' else f'.venv-{args.stack}'
    venv = (args.venv or setup_env.ROOT / default).absolute()
    setup_env.setup(args.stack, venv)
    runs = [(tests_of(args.stack), []), (list(INSTALL_LINES[args.stack]), ['--install-lines'])]
    code = 0
    for nodes, options in runs:
        if not nodes:
            continue
        # its own temp root and no cache files: it may run beside another pytest in this checkout
        with tempfile.TemporaryDirectory(prefix=f'mmvit_ext_{args.stack}.') as basetemp:
            code |= subprocess.run([str(venv / 'bin' / 'python'), '-m', 'pytest', '-q', '-p',
                                    'no:cacheprovider', '--basetemp', basetemp, *options, *nodes,
                                    *pytest_args], cwd=setup_env.ROOT).returncode
    return code


if __name__ == '__main__':
    sys.exit(main())
