"""``nondeterministic_cuda_modules`` (mmvit_ext.engine.determinism) reports every module whose
CUDA backward is not reproducible, in every registered backbone and in the heads and necks of
every shipped config. Checked two ways, neither read from the table: by class, against the list
below; and for the backbones, by the aten ops their training forward runs on tensors that need
a gradient, each attributed to the innermost module running it."""
import functools
import importlib
from typing import Dict, List, Set, Tuple

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mmvit_ext.engine import check_cuda_determinism, nondeterministic_cuda_modules
from mmvit_ext.errors import ConfigError
from mmvit_ext.backbones import BaseBackbone
from mmvit_ext.registry import MODELS
from mmvit_ext.utils import build_model, task_scope
from backbone_cases import SMALL
from shipped_configs import CONFIGS, load

# mmcv ops whose CUDA backward kernel accumulates with atomicAdd
# (mmcv/ops/csrc/common/cuda/<op>_cuda_kernel.cuh), grid_sample users, and mmseg's decode heads,
# whose loss resizes the logits bilinearly (and UPerHead's PPM pools adaptively)
KNOWN_CLASSES = ('mmcv.ops.RoIAlign', 'mmcv.ops.RoIPool', 'mmcv.ops.DeformConv2d',
                 'mmcv.ops.ModulatedDeformConv2d', 'mmcv.ops.MultiScaleDeformableAttention',
                 'mmcv.ops.DeformRoIPool', 'mmcv.ops.RoIAlignRotated', 'mmcv.ops.CARAFENaive',
                 'mmvit_ext.layers.deform_attn.MSDeformAttn',
                 'mmseg.models.decode_heads.decode_head.BaseDecodeHead')
BILINEAR_MODES = ('linear', 'bilinear', 'bicubic', 'trilinear')


def _refused_torch_module(module: nn.Module) -> bool:
    """torch modules whose CUDA backward torch refuses under use_deterministic_algorithms (its
    docstring's list); adaptive average pooling to 1 x 1 is a mean, which it is not."""
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return module.output_size not in (1, (1, 1))
    if isinstance(module, nn.Upsample):
        return module.mode in BILINEAR_MODES
    return isinstance(module, (nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool2d, nn.AvgPool3d,
                               nn.MaxPool3d, nn.FractionalMaxPool2d, nn.ReflectionPad1d,
                               nn.ReflectionPad2d, nn.ReflectionPad3d, nn.EmbeddingBag))


# aten ops, as a forward runs them, that torch refuses on CUDA under use_deterministic_algorithms
# when a gradient is needed (its docstring's list: grid_sample, linear-family resize, adaptive /
# 3d pooling, reflection padding, ...); their CUDA backward kernels accumulate with atomicAdd
REFUSED_OPS = {'grid_sampler_2d', 'grid_sampler_3d', 'upsample_linear1d', 'upsample_bilinear2d',
               'upsample_bicubic2d', 'upsample_trilinear3d', '_upsample_bilinear2d_aa',
               '_upsample_bicubic2d_aa', '_adaptive_avg_pool2d', '_adaptive_avg_pool3d',
               'adaptive_max_pool2d', 'adaptive_max_pool3d', 'avg_pool3d',
               'max_pool3d_with_indices', 'fractional_max_pool2d', 'fractional_max_pool3d',
               'reflection_pad1d', 'reflection_pad2d', 'reflection_pad3d', '_embedding_bag',
               'cumsum', 'nll_loss2d_forward'}


@functools.lru_cache(maxsize=None)
def _known_classes() -> Tuple[type, ...]:
    """:data:`KNOWN_CLASSES` that are importable (a codebase not installed holds no module)."""
    classes = []
    for dotted in KNOWN_CLASSES:
        module, _, name = dotted.rpartition('.')
        try:
            classes.append(getattr(importlib.import_module(module), name))
        except ImportError:
            continue
    return tuple(classes)


def _known(module: nn.Module) -> bool:
    return isinstance(module, _known_classes()) or _refused_torch_module(module)


def _reported(model: nn.Module) -> Set[str]:
    return {entry.split(' (')[0] for entry in nondeterministic_cuda_modules(model)}


def _covered(name: str, reported: Set[str]) -> bool:
    """``name`` or a module holding it is reported (a decode head covers its PPM)."""
    return any(name == r or name.startswith(r + '.') for r in reported)


def _check_by_class(model: nn.Module) -> List[str]:
    """Names of the known modules of ``model`` that the table does not cover."""
    reported = _reported(model)
    known = [name for name, module in model.named_modules() if _known(module)]
    return [name for name in known if not _covered(name, reported)]


class RefusedOpsByModule(TorchDispatchMode):
    """Records ``(innermost module name, op)`` for each op of :data:`REFUSED_OPS` that gets a
    tensor needing a gradient, while ``model`` runs forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.stack: List[str] = ['']
        self.found: Set[Tuple[str, str]] = set()
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(
                lambda *_, name=name: self.stack.append(name)))
            self.handles.append(module.register_forward_hook(self._leave))

    def _leave(self, *_) -> None:  # returns None: the module's output stays as it is
        self.stack.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket.__name__
        if op in REFUSED_OPS:
            tensors = tree_flatten((args, kwargs or {}))[0]
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
                self.found.add((self.stack[-1], op))
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return super().__exit__(*exc)


def _registered() -> List[str]:
    MODELS.import_from_location()  # backbones only: a config may import mmvit_ext.heads
    return sorted(name for name, cls in MODELS.module_dict.items()
                  if isinstance(cls, type) and issubclass(cls, BaseBackbone))


def _backbone(name: str) -> nn.Module:
    """The smallest case of a registered family (tests/backbone_cases.py), in training mode,
    held as ``backbone`` (as in a detector)."""
    return nn.ModuleDict(dict(backbone=MODELS.get(name)(**SMALL[name]).train()))


@pytest.mark.parametrize('name', _registered())
def test_backbone_refused_ops_are_reported(name):
    """Every module that runs a refused op on a tensor needing a gradient is reported (or a
    module holding it), and every module our backbones report runs one."""
    model = _backbone(name)
    with RefusedOpsByModule(model) as record:
        model['backbone'](torch.randn(1, 3, 64, 96))
    reported = _reported(model)
    missed = sorted((module, op) for module, op in record.found if not _covered(module, reported))
    assert not missed, f'{name}: refused ops in modules the table does not report: {missed}'
    ran = {module for module, _ in record.found}
    idle = sorted(r for r in reported if not any(_covered(m, {r}) for m in ran))
    assert not idle, f'{name}: reported, but running no refused op: {idle}'
    assert _check_by_class(model) == []


def test_vit_adapter_reports_every_deformable_attention():
    """Issue 55: mmcv's CUDA kernel runs inside our MSDeformAttn, so the table must see it."""
    from mmvit_ext.layers.deform_attn import MSDeformAttn
    model = _backbone('ViTAdapter')
    attentions = [n for n, m in model.named_modules() if isinstance(m, MSDeformAttn)]
    assert len(attentions) >= 2
    assert set(attentions) <= _reported(model)
    entry = next(e for e in nondeterministic_cuda_modules(model) if e.startswith(attentions[0]))
    assert 'atomicAdd in the CUDA backward of the compiled kernel and of grid_sample' in entry
    with pytest.raises(ConfigError, match=attentions[0].replace('.', r'\.')):
        check_cuda_determinism(model, 'cuda', True)
    # the adapter itself resizes the ViT maps only where it adds them to other levels than 2
    cfg = SMALL['ViTAdapter']
    found = nondeterministic_cuda_modules(MODELS.get('ViTAdapter')(**cfg))
    assert found[0].startswith('ViTAdapter (add_vit_feature: bilinear resize')
    assert len(found) == 1 + len(attentions)
    for settings in (dict(add_vit_feature=False), dict(out_indices=(2,))):
        found = nondeterministic_cuda_modules(MODELS.get('ViTAdapter')(**cfg, **settings))
        assert len(found) == len(attentions) and not found[0].startswith('ViTAdapter (')


def _head_configs() -> Dict[str, Tuple[str, str, dict]]:
    """Every distinct head / neck config of the shipped configs: text -> (scope, key, config)."""
    heads = {}
    for path in CONFIGS:
        cfg = load(path)
        scope = cfg.get('default_scope') or task_scope(cfg)
        for key, part in cfg.model.items():
            if key in ('backbone', 'data_preprocessor', 'train_cfg', 'test_cfg', 'init_cfg'):
                continue
            for one in part if isinstance(part, list) else [part]:
                if not isinstance(one, dict) or 'type' not in one:
                    continue
                heads.setdefault(f'{scope}: {one!r}', (scope, key, one))
    return heads


def test_heads_of_shipped_configs_are_reported():
    """mmdet's RoI heads (mmcv RoIAlign), mmseg's decode heads, mmpretrain's heads and every
    neck, built as the configs give them."""
    seen, missed = set(), []
    for scope, key, part in _head_configs().values():
        with torch.device('meta'):  # module types only: no weights (the 7B's Mask2Former)
            model = nn.ModuleDict({key: build_model(part, scope=scope)})
        seen |= {type(m).__name__ for m in model.modules() if _known(m)}
        missed += [f'{scope} {n}' for n in _check_by_class(model)]
    assert not missed, missed
    # the shipped configs hold all three kinds: mmcv's RoIAlign, mmseg heads, torch pooling
    assert {'RoIAlign', 'UPerHead', 'FCNHead', 'AdaptiveAvgPool2d'} <= seen, seen
