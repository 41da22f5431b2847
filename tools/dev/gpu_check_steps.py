"""The steps of the GPU check (tools/dev/gpu_check.py): what each row runs and measures, on CUDA
and in its tiny CPU variant. Standard library only."""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

TRAIN_CONFIG = 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'
FSDP_OPTIONS = ('runner_type=FlexibleRunner', 'strategy.type=FSDPStrategy',
                'strategy.model_wrapper.auto_wrap_policy.type=mmvit_ext.backbone_block_policy',
                'strategy.model_wrapper.mixed_precision.param_dtype=bfloat16',
                'strategy.model_wrapper.mixed_precision.reduce_dtype=float32',
                'strategy.model_wrapper.mixed_precision.buffer_dtype=float32')
# the ViTDet ViT-B, whose peers are timm's and mmpretrain's SAM ViT (mmvit_ext/benchmark/peers.py)
BENCH_SETTINGS = {'vit:b': ('--set', 'use_rel_pos=True', 'final_norm=False')}
# EoMT-L against the DINOv3 adapter + Mask2Former on the same trunk, the head at the EoMT paper's
# baseline width (256); the CPU variant at ViT-S
SEGMENTERS = ('configs/mmseg/eomt_dinov3_vitl16_512x512_ade20k.py',
              'configs/mmseg/mask2former_dinov3_vitl16_adapter_512x512_160k_ade20k.py')
DETECTORS = {'Swin-T': 'configs/mask_rcnn_swin_t_fpn_1x_coco.py',
             'PVTv2-b2': 'configs/mask_rcnn_pvtv2_b2.py'}


@dataclass(frozen=True)
class Settings:
    """What differs between the CUDA check and its tiny CPU variant."""

    train_size: int
    deterministic: bool
    train_validates: bool                # the val loop after the epoch (minutes on CPU)
    train_options: Tuple[str, ...]       # of every training row
    amp_dtypes: Tuple[str, ...]          # CPU AMP is bf16 only (CpuAmpOptimWrapper)
    bench_models: Tuple[str, ...]
    bench_size: Tuple[int, int]
    bench_batch: int
    bench_args: Tuple[str, ...]          # warmup, repeat and the peers
    compile_backend: str                 # of the compiled bench rows
    detector_batch: int
    detector_size: Tuple[int, int]
    detector_args: Tuple[str, ...]       # dtype, warmup, repeat
    ladder_name: str
    ladder_args: Tuple[str, ...]
    segmenter_name: str
    segmenter_args: Tuple[str, ...]      # size, dtype, warmup, repeat, trunk settings


def names_in(text: str) -> List[str]:
    """``'a,b c'`` -> ``['a', 'b', 'c']`` (comma- or space-separated names)."""
    return [name for name in re.split(r'[,\s]+', text) if name]


def settings_for(device: str, env: Mapping[str, str] = os.environ) -> Settings:
    if device == 'cuda':
        return Settings(
            train_size=800, deterministic=False, train_validates=True, train_options=(),
            amp_dtypes=('bfloat16', 'float16'),
            bench_models=tuple(names_in(env.get('BENCH_MODELS') or 'swin:tiny,pvtv2:b2,vit:b')),
            bench_size=(800, 1344),
            bench_batch=int(env.get('BENCH_BATCH') or 8),
            bench_args=('--warmup', '2', '--repeat', '5', '--compare'), compile_backend='inductor',
            detector_batch=2, detector_size=(800, 1333),
            detector_args=('--dtype', 'bf16', '--warmup', '2', '--repeat', '5'),
            ladder_name='ladder Swin-L 800x1333',
            ladder_args=('--arch', 'large', '--size', '800', '1333', '--repeat', '3'),
            segmenter_name='segmenter EoMT-L vs adapter-L + M2F inference bf16 b1 512x512',
            segmenter_args=('--size', '512', '512', '--dtype', 'bf16', '--warmup', '3',
                            '--repeat', '20'))
    return Settings(
        train_size=64, deterministic=True, train_validates=False, amp_dtypes=('bfloat16',),
        # fewer proposals and sampled RoIs: the RoI heads' CPU time is most of a step at 64 px
        train_options=('model.train_cfg.rpn_proposal.max_per_img=64',
                       'model.train_cfg.rcnn.sampler.num=16'),
        bench_models=('pvtv2:b0',), bench_size=(64, 64), bench_batch=1,
        bench_args=('--warmup', '1', '--repeat', '1', '--peak-size', '256'),
        compile_backend='aot_eager',  # traces and runs the graphs; inductor's C++ build is minutes
        # fp32: a whole detector under bf16 autocast takes minutes a step on CPU
        detector_batch=1, detector_size=(64, 64),
        detector_args=('--dtype', 'fp32', '--warmup', '0', '--repeat', '1'),
        ladder_name='ladder Swin-T 96x128',
        # --repeat 0: each row's one step is its memory and its time
        ladder_args=('--arch', 'tiny', '--size', '96', '128', '--warmup', '0', '--repeat', '0',
                     '--rows', 'ours:fp32:False', "ours:fp32:'attn'", 'mmdet:fp32:True'),
        segmenter_name='segmenter EoMT-S vs adapter-S + M2F inference fp32 b1 64x64',
        segmenter_args=('--size', '64', '64', '--warmup', '0', '--repeat', '1', '--cfg-options',
                        'model.backbone.arch=dinov3_vits16', 'model.test_cfg.crop_size=(64,64)',
                        '--against-options', 'model.backbone.arch=dinov3_vits16',
                        'model.backbone.interaction_indexes=[2,5,8,11]',
                        'model.decode_head.in_channels=[384,384,384,384]'))


@dataclass(frozen=True)
class Row:
    """One row of the table: a command run in its own process, its output in ``log_name``;
    a training row (``work`` set) first makes the demo data and then checks the losses."""

    name: str
    argv: Tuple[str, ...]
    work: Optional[Path] = None

    @property
    def log_name(self) -> str:
        return re.sub(r'[ /:]', '_', self.name) + '.log'


@dataclass
class Check:
    """One run: its options, the rows so far and where they go."""

    device: str
    python: str
    out: Path
    steps: str
    rows: List[str] = field(default_factory=list)
    failed: bool = False
    desc: str = ''
    start: float = field(default_factory=time.monotonic)

    @property
    def settings(self) -> Settings:
        return settings_for(self.device)

    @property
    def logs(self) -> Path:
        return self.out.parent / 'logs'

    @property
    def data(self) -> Path:
        return self.logs / 'demo_shapes'


def train_row(check: Check, name: str, work: str, launch: Sequence[str],
              extra: Sequence[str] = (), options: Sequence[str] = ()) -> Row:
    """2 iterations (batch 2) of the demo Mask R-CNN PVTv2-b2 on the demo data; on CUDA, its val."""
    data, size = f'{check.data}/', check.settings.train_size
    roots = [f'{split}_dataloader.dataset.data_root={data}' for split in ('train', 'val', 'test')]
    argv = (*launch, 'tools/train.py', TRAIN_CONFIG, '--work-dir', str(check.logs / f'work_{work}'),
            *extra, '--cfg-options', f'data_root={data}', *roots,
            f'val_evaluator.ann_file={data}annotations/instances_val.json',
            f'test_evaluator.ann_file={data}annotations/instances_val.json',
            f'train_dataloader.dataset.pipeline.2.scale=({size},{size})', 'train_cfg.max_epochs=1',
            'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
            'default_hooks.logger.interval=1',
            'default_hooks.checkpoint.interval=100', 'default_hooks.checkpoint.save_last=False',
            f'randomness.deterministic={check.settings.deterministic}',
            # mmengine validates after the last epoch unless that comes before val_begin
            *(() if check.settings.train_validates else ('train_cfg.val_begin=2',)),
            *check.settings.train_options, *options)
    return Row(name, argv, check.logs / f'work_{work}')


def torchrun(check: Check, port: int) -> Tuple[str, ...]:
    """One process through torch's launcher (what ``torchrun`` runs), on its own port."""
    return (check.python, '-m', 'torch.distributed.run', '--nproc_per_node', '1',
            '--master_port', str(port))


def probe_rows(check: Check) -> List[Row]:
    return [Row('probe ops', (check.python, 'tools/analysis/ops_probe.py', '--device', check.device,
                              '--dtype', 'bf16'))]


def contract_rows(check: Check) -> List[Row]:
    return [Row(f'contract {dtype}', (check.python, 'tools/analysis/device_check.py', '--device',
                                      check.device, '--dtype', dtype))
            for dtype in ('fp32', 'bf16', 'fp16')]


def kernel_rows(check: Check) -> List[Row]:
    return [Row('attention kernels', (check.python, 'tests/attention_kernels.py', '--device',
                                      check.device))]


def amp_train_rows(check: Check) -> List[Row]:
    return [train_row(check, f'amp-train {dtype} Mask R-CNN PVTv2-b2', f'amp_{dtype}', [check.python],
                      ['--amp'], [f'optim_wrapper.dtype={dtype}'])
            for dtype in check.settings.amp_dtypes]


def ddp_rows(check: Check) -> List[Row]:
    return [train_row(check, 'ddp 1 process Mask R-CNN PVTv2-b2', 'ddp', torchrun(check, 29561),
                      ['--launcher', 'pytorch'])]


def fsdp_rows(check: Check) -> List[Row]:
    return [train_row(check, 'fsdp 1 process bf16 params Mask R-CNN PVTv2-b2', 'fsdp',
                      torchrun(check, 29562), ['--launcher', 'pytorch'], FSDP_OPTIONS)]


def bench_rows(check: Check, compiled: bool = False) -> List[Row]:
    s = check.settings
    height, width = s.bench_size
    extra = ('--compile', '--compile-backend', s.compile_backend) if compiled else ()
    kind = 'compiled' if compiled else 'bf16'
    return [Row(f'bench {kind} {model} b{s.bench_batch} {height}x{width}',
                (check.python, 'tools/analysis/benchmark.py', model, '--device', check.device,
                 '--dtype', 'bf16', '--batch', str(s.bench_batch), '--size', str(height), str(width),
                 '--modes', 'fwdbwd', *s.bench_args, *extra, *BENCH_SETTINGS.get(model, ()),
                 '--profile', str(check.logs / f'profile_{kind}' / model.replace(':', '_'))))
            for model in s.bench_models]


def detector_rows(check: Check) -> List[Row]:
    s = check.settings
    height, width = s.detector_size
    return [Row(f'detector Mask R-CNN {name} b{s.detector_batch} {height}x{width}',
                (check.python, 'tools/analysis/detector_speed.py', config, '--device', check.device,
                 '--batch', str(s.detector_batch), '--size', str(height), str(width),
                 *s.detector_args, '--name', name))
            for name, config in DETECTORS.items()]


def segmenter_rows(check: Check) -> List[Row]:
    s = check.settings
    eomt, m2f = SEGMENTERS
    args = list(s.segmenter_args)
    if '--against-options' not in args:
        args.append('--against-options')
    return [Row(s.segmenter_name, (check.python, 'tools/analysis/benchmark.py', '--config', eomt,
                                   '--against', m2f, '--device', check.device, '--batch', '1',
                                   '--modes', 'fwd', '--eval', *args,
                                   'model.decode_head.hidden_dims=256'))]


def ladder_rows(check: Check) -> List[Row]:
    s = check.settings
    return [Row(s.ladder_name, (check.python, 'tools/analysis/memory_ladder.py', '--device',
                                check.device, *s.ladder_args, '--out', str(check.logs / 'ladder.md')))]


@dataclass(frozen=True)
class Step:
    what: str                              # one line of --help
    rows: Callable[[Check], List[Row]]
    default: bool = True                   # run without --steps


# In the order they run: most value per second first, the OOM-prone next to last, then the opt-in
# compiles (minutes of inductor builds on a GPU).
STEPS: Dict[str, Step] = {
    'probe': Step("mmcv's nms / RoIAlign / mask-target crop run on the device (tools/analysis/ops_probe.py)",
                  probe_rows),
    'contract': Step('the backbone contract on the device, fp32 / bf16 / fp16 (tools/analysis/device_check.py)',
                     contract_rows),
    'kernels': Step('the kernel of each attention call site (SDPA backend, explicit, grid_sample or '
                    'mmcv), fp32 / bf16 / fp16, inference and training (tests/attention_kernels.py)',
                    kernel_rows),
    'amp-train': Step('Mask R-CNN PVTv2-b2, 2 iterations through tools/train.py --amp, bf16 and fp16',
                      amp_train_rows),
    'ddp': Step('the same through torch.distributed.run (1 process) and mmengine\'s DDP wrapper',
                ddp_rows),
    'fsdp': Step("the same through mmengine's FlexibleRunner + FSDPStrategy, bf16 parameters",
                 fsdp_rows),
    'bench': Step('bf16 fwd+bwd, 800x1344, Swin-T, PVTv2-b2 and ViTDet ViT-B against their '
                  'OpenMMLab peer and timm, each profiled (benchmark.py)',
                  bench_rows),
    'detector': Step("Mask R-CNN training step, bf16, b2, 800x1333: Swin-T / PVTv2-b2, ours vs mmdet's",
                     detector_rows),
    'segmenter': Step('EoMT-L against the DINOv3 adapter-L + Mask2Former (head width 256), '
                      'inference, bf16, b1, 512x512 (benchmark.py --config --against)',
                      segmenter_rows),
    'ladder': Step('the Swin-L memory ladder, 800x1333, ours and mmdet at equal dtypes (memory_ladder.py)',
                   ladder_rows),
    'compiled': Step('opt-in: bench again, every side torch.compile-d (9 inductor builds; the '
                     'CPU variant: aot_eager)',
                     partial(bench_rows, compiled=True), default=False),
}


def parse_steps(text: str) -> List[str]:
    """``'bench,ladder'`` -> the named steps; ValueError names an unknown one."""
    names = names_in(text)
    for name in names:
        if name not in STEPS:
            raise ValueError(f'unknown step {name} (steps: {" ".join(STEPS)})')
    return names
