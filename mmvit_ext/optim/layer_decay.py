"""Layer-wise learning-rate decay for any model whose backbone reports ``get_layer_depth``.

A parameter at layer ``i`` of ``L`` (see :meth:`BaseBackbone.get_layer_depth`) trains with
``lr = base_lr * lr_mult * layer_decay_rate ** (L - 1 - i)``: the embeddings slowest, the neck
and heads at the base rate (BEiT, ViTDet). Parameters with equal settings share one group, so a
24-block model gets about two groups per layer (with and without weight decay), not one per
parameter.
"""
from collections import defaultdict
from typing import Callable, Dict, List, Tuple

from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from ..engine.fsdp import strip_wrapper_prefixes
from ..registry import OPTIM_WRAPPER_CONSTRUCTORS

LayerDepthFn = Callable[[str], Tuple[int, int]]
NORMS = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)
KNOWN_KEYS = frozenset({'layer_decay_rate', 'custom_keys', 'norm_decay_mult', 'bias_decay_mult',
                        'flat_decay_mult', 'bypass_duplicate'})


def find_layer_depth(model: nn.Module) -> LayerDepthFn:
    """``name -> (layer_id, num_layers)`` for a whole model (its ``backbone.*`` reports, the
    rest is the top layer), an mmpretrain classifier, or a bare backbone."""
    backbone = getattr(model, 'backbone', None)
    if backbone is not None and hasattr(backbone, 'get_layer_depth'):
        return lambda name: backbone.get_layer_depth(name, prefix='backbone.')
    if hasattr(model, 'get_layer_depth'):
        return model.get_layer_depth
    raise TypeError(f'LayerDecayOptimWrapperConstructor: neither {type(model).__name__} nor its '
                    f'backbone has get_layer_depth(param_name, prefix); use an mmvit_ext '
                    f'backbone or drop layer_decay_rate')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Parameter groups by (layer-decayed lr, weight decay), merged when equal.

    ``paramwise_cfg`` keys:

    - ``layer_decay_rate``: lr factor per layer below the top (default 1: no decay).
    - ``custom_keys``: ``{substring: dict(lr_mult=..., decay_mult=..., **extra)}``; the longest
      matching key wins (mmengine's rule) and the other rules are skipped. ``lr_mult``
      multiplies the layer scale.
    - ``norm_decay_mult`` (norm layers), ``bias_decay_mult`` (other biases),
      ``flat_decay_mult`` (other 1-D parameters, e.g. LayerScale), in this order.

    Frozen parameters (``requires_grad=False``) are left out.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict = None) -> None:
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        unknown = set(self.paramwise_cfg) - KNOWN_KEYS
        if unknown:
            raise ValueError(f'LayerDecayOptimWrapperConstructor: paramwise_cfg keys '
                             f'{sorted(unknown)} are not supported; supported: '
                             f'{sorted(KNOWN_KEYS)}')
        rate = self.paramwise_cfg.get('layer_decay_rate', 1.0)
        if not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ValueError(f'LayerDecayOptimWrapperConstructor: layer_decay_rate must be in '
                             f'(0, 1], got {rate!r}')
        if self.base_lr is None:
            raise ValueError('LayerDecayOptimWrapperConstructor: the optimizer needs lr=...')
        self.decay_rate = float(rate)

    def param_settings(self, name: str, param: nn.Parameter, module: nn.Module) -> Dict:
        """lr multiplier, weight decay and extra keys of one parameter (before layer decay)."""
        cfg = self.paramwise_cfg
        custom_keys = cfg.get('custom_keys', {})
        for key in sorted(sorted(custom_keys), key=len, reverse=True):
            if key in name:
                extra = dict(custom_keys[key])
                lr_mult, decay_mult = extra.pop('lr_mult', 1.0), extra.pop('decay_mult', 1.0)
                settings = dict(lr_mult=lr_mult, **extra)
                if self.base_wd is not None:
                    settings['weight_decay'] = self.base_wd * decay_mult
                return settings
        settings: Dict = dict(lr_mult=1.0)
        if self.base_wd is None:
            return settings
        short = name.rsplit('.', 1)[-1]
        for applies, mult_key in ((isinstance(module, NORMS), 'norm_decay_mult'),
                                  (short == 'bias', 'bias_decay_mult'),
                                  (param.ndim == 1, 'flat_decay_mult')):
            if applies and cfg.get(mult_key) is not None:
                settings['weight_decay'] = self.base_wd * cfg[mult_key]
                return settings
        settings['weight_decay'] = self.base_wd
        return settings

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        """Fill ``params`` with one group per distinct (lr, weight decay, extra keys)."""
        layer_depth = find_layer_depth(module)
        merged: Dict[tuple, dict] = {}
        layers: Dict[tuple, set] = defaultdict(set)
        seen = set()  # shared parameters (tied weights) go into the first group only
        for module_name, owner in module.named_modules():
            for short, param in owner.named_parameters(recurse=False):
                name = strip_wrapper_prefixes(f'{module_name}.{short}' if module_name else short)
                if not param.requires_grad or id(param) in seen:
                    continue
                seen.add(id(param))
                settings = self.param_settings(name, param, owner)
                layer_id, num_layers = layer_depth(name)
                scale = self.decay_rate ** (num_layers - 1 - layer_id)
                group = dict(lr=self.base_lr * settings.pop('lr_mult') * scale, lr_scale=scale,
                             **settings)
                key = tuple(sorted(group.items()))
                merged.setdefault(key, dict(params=[], **group))['params'].append(param)
                layers[key].add(layer_id)
        params.extend(merged.values())
        if get_rank() == 0:
            self.log_summary(list(merged.values()), [sorted(v) for v in layers.values()])

    def log_summary(self, groups: List[dict], layer_ids: List[List[int]]) -> None:
        """One line per lr: its layers and the parameter count per weight decay."""
        by_lr: Dict[float, dict] = {}
        for group, ids in zip(groups, layer_ids):
            row = by_lr.setdefault(group['lr'], dict(scale=group['lr_scale'], ids=set(), wd={}))
            row['ids'].update(ids)
            wd = group.get('weight_decay')
            row['wd'][wd] = row['wd'].get(wd, 0) + len(group['params'])
        lines = [f'layer decay {self.decay_rate}: {len(groups)} parameter groups from '
                 f'{sum(len(g["params"]) for g in groups)} parameters (lr: params per weight '
                 f'decay)']
        for lr, row in sorted(by_lr.items(), key=lambda item: min(item[1]['ids'])):
            ids = sorted(row['ids'])
            span = f'{ids[0]}' if len(ids) == 1 else f'{ids[0]}-{ids[-1]}'
            counts = ', '.join(f'{wd:g}: {n}' if wd is not None else f'default: {n}'
                               for wd, n in row['wd'].items())
            lines.append(f'  layer {span}: lr {lr:.3g} (x{row["scale"]:.4g}) {counts}')
        print_log('\n'.join(lines), logger='current')
