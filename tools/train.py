"""Train a detector / segmentor / classifier whose config uses mmvit_ext backbones.

Example:
    python tools/train.py configs/mask_rcnn_pvtv2_b2.py --work-dir work_dirs/pvtv2 --amp
    python tools/train.py configs/demo/mask_rcnn_pvtv2_b2_demo.py      # built-in demo data
    python tools/train.py CONFIG --resume                            # latest checkpoint
    python tools/train.py CONFIG --amp --compile     # bf16/fp16, the backbone compiled
    python tools/train.py CONFIG --retain-heap     # CPU: reuse freed memory (fewer page faults)
    bash tools/dist_train.sh configs/fsdp/mask_rcnn_swin_l_fpn_fsdp_1x_coco.py 8  # FSDP
"""
import argparse
import os
import os.path as osp
import sys

from mmengine.config import Config, DictAction

import mmvit_ext  # noqa: F401  (registers backbones)
from mmvit_ext.engine import (COMPILE_TARGETS, AtomicSaveRunner, add_run_hooks, amp_on_cpu,
                              apply_compile_choice, compile_backbone, init_cpu_distributed,
                              prepare_cuda_determinism, prepare_strategy)
from mmvit_ext.errors import ConfigError
from mmvit_ext.utils import retain_freed_memory
from mmvit_ext.utils.env_check import require_working_environment
from mmvit_ext.utils.safe_checkpoint import trusted_training_state
from mmvit_ext.utils.config_checks import (load_run_config, missing_data, missing_pretrained,
                                          neck_channel_mismatch)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='directory for logs and checkpoints')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by the real total batch size / base_batch_size')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from PATH, or without PATH from the latest checkpoint in '
                             'the work dir')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings, e.g. train_cfg.max_epochs=1')
    parser.add_argument('--compile', nargs='?', const='backbone', choices=COMPILE_TARGETS,
                        help='torch.compile the backbone in place (default; options from the '
                             "config's compile dict) or mmengine's whole train_step ('model')")
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    parser.add_argument('--retain-heap', action='store_true',
                        help='keep freed CPU memory in the process for reuse (glibc): faster CPU '
                             'steps, higher resident peak; see mmvit_ext.utils.heap')
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_config(args: argparse.Namespace) -> Config:
    if not osp.isfile(args.config):
        sys.exit(f'error: config file not found: {args.config}')
    cfg = load_run_config(args.config, args.cfg_options, args.launcher, args.work_dir)
    if args.amp:
        if cfg.optim_wrapper.get('type', 'OptimWrapper') == 'OptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if amp_on_cpu(cfg.get('optim_wrapper') or {}):
        print('[amp] no CUDA device: mixed precision runs as CPU bfloat16 autocast '
              '(mmvit_ext.CpuAmpOptimWrapper)')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            sys.exit('error: --auto-scale-lr needs auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume:
        cfg.resume, cfg.load_from = True, args.resume
    return cfg


def main() -> None:
    args = parse_args()
    if args.retain_heap:
        setting = retain_freed_memory()
        print(f'[heap] --retain-heap {"took effect" if setting else "had no effect"}: '
              f'{setting.reason}', file=sys.stderr if not setting else sys.stdout)
    cfg = build_config(args)
    try:
        prepare_cuda_determinism(cfg)  # before any CUDA work: cuBLAS reads it once
    except ConfigError as err:  # randomness.deterministic not a bool
        sys.exit(f'error: {args.config}: {err}')
    require_working_environment(cfg)  # installed packages that break what this config imports
    problems = neck_channel_mismatch(cfg) + missing_data(cfg, ('train', 'val'))
    if not cfg.get('resume'):
        problems += missing_pretrained(cfg)
    if problems:
        sys.exit(f'error: {args.config}: ' + ' | '.join(problems))
    # float32 around mmcv ops (whole-model bf16), determinism checked, exact resume
    add_run_hooks(cfg, training=True)
    init_cpu_distributed(args.launcher)  # gloo when there is no GPU
    compile_options = apply_compile_choice(cfg, args.compile)
    if prepare_strategy(cfg):  # FSDP / DeepSpeed: mmengine's FlexibleRunner
        if args.compile == 'backbone':
            sys.exit('error: --compile backbone runs with the plain runner; under a strategy '
                     '(FSDP / DeepSpeed) use --compile model')
        from mmengine.runner import FlexibleRunner
        runner = FlexibleRunner.from_cfg(cfg)
    else:
        runner = AtomicSaveRunner.from_cfg(cfg)  # checkpoints written atomically
    if args.compile == 'backbone':
        backbone = compile_backbone(runner.model, **compile_options)
        print(f'[compile] {type(backbone).__name__} compiled in place (torch.compile '
              f'{compile_options or "defaults"}); the first iterations include the compile time')
    with trusted_training_state():  # --resume / load_from: mmengine's training state
        runner.train()


if __name__ == '__main__':
    main()
