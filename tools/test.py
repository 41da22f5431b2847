"""Evaluate a checkpoint written by tools/train.py (or any OpenMMLab checkpoint).

Example:
    python tools/test.py configs/mask_rcnn_pvtv2_b2.py work_dirs/mask_rcnn_pvtv2_b2/epoch_12.pth
    python tools/test.py CONFIG CKPT --out results.pkl --show-dir vis   # also draw predictions
"""
import argparse
import os
import os.path as osp
import sys

from mmengine.config import DictAction
from mmengine.runner import Runner

import mmvit_ext  # noqa: F401  (registers backbones)
from mmvit_ext.converters import CheckpointError
from mmvit_ext.converters.io import is_url, resolve_checkpoint
from mmvit_ext.engine import add_run_hooks, init_cpu_distributed, prepare_cuda_determinism
from mmvit_ext.errors import ConfigError
from mmvit_ext.utils.config_checks import load_run_config, missing_data
from mmvit_ext.utils.env_check import require_working_environment
from mmvit_ext.utils.safe_checkpoint import trusted_training_state


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='directory for the evaluation log and metrics')
    parser.add_argument('--out', help='dump predictions to a pickle file')
    parser.add_argument('--show-dir', help='write visualised predictions (PNG) to this '
                                           'directory, relative to the work dir')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main() -> None:
    args = parse_args()
    if is_url(args.checkpoint):  # into the torch hub cache (as mmengine does), read from there
        try:
            args.checkpoint = str(resolve_checkpoint(args.checkpoint))
        except CheckpointError as err:
            sys.exit(f'error: {err}')
    for path in (args.config, args.checkpoint):
        if not osp.isfile(path):
            sys.exit(f'error: file not found: {path}')
    cfg = load_run_config(args.config, args.cfg_options, args.launcher, args.work_dir)
    try:
        prepare_cuda_determinism(cfg)  # before any CUDA work: cuBLAS reads it once
    except ConfigError as err:  # randomness.deterministic not a bool
        sys.exit(f'error: {args.config}: {err}')
    require_working_environment(cfg)  # installed packages that break what this config imports
    problems = missing_data(cfg, ('test',))
    if problems:
        sys.exit(f'error: {args.config}: ' + ' | '.join(problems))
    # any known layout (e.g. a whole mmdet / mmseg checkpoint): the backbone converts on load
    cfg.load_from = args.checkpoint
    # weights come from the checkpoint: no pretrained file is needed
    backbone = cfg.model.get('backbone')
    if isinstance(backbone, dict):
        backbone.init_cfg = None
    if args.show_dir:
        hooks = cfg.setdefault('default_hooks', {})
        if 'visualization' not in hooks:
            sys.exit('error: --show-dir needs default_hooks.visualization in the config')
        hooks.visualization.update(draw=True, test_out_dir=args.show_dir)
    add_run_hooks(cfg, training=False)  # float32 around mmcv ops under test_cfg fp16
    init_cpu_distributed(args.launcher)  # gloo when there is no GPU
    runner = Runner.from_cfg(cfg)
    if args.out:
        runner.test_evaluator.metrics.append(
            _dump_metric(args.out))
    with trusted_training_state():  # the checkpoint may hold mmengine's training state
        runner.test()


def _dump_metric(path: str):
    from mmengine.evaluator import DumpResults
    return DumpResults(out_file_path=path)


if __name__ == '__main__':
    main()
