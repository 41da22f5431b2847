"""DINOv3 ConvNeXt checkpoints -> our ConvNeXt layout (``backbones/convnext.py``).

Ours: ``layers.{i}.downsample.{proj,norm}``, ``layers.{i}.blocks.{j}.{dwconv, norm, mlp.fc1,
mlp.fc2, ls.gamma}``, ``norm`` (the final norm, built with ``out_norm``). Layouts:

* official (facebookresearch/dinov3 hub ``dinov3_convnext_*`` files, and the original
  facebookresearch/ConvNeXt ones, which share it): ``downsample_layers.{i}.{0,1}`` (stage 0:
  conv, norm; later: norm, conv), ``stages.{i}.{j}.{dwconv, norm, pwconv1, pwconv2, gamma}``,
  ``norm``; ``norms.3`` (the same module as ``norm``, saved twice) and a classifier ``head``
  dropped.
* Hugging Face ``DINOv3ConvNextModel`` / ``DINOv3ConvNextBackbone``:
  ``stages.{i}.downsample_layers.{0,1}``, ``stages.{i}.layers.{j}.{depthwise_conv,
  layer_norm, pointwise_conv1, pointwise_conv2, gamma}``, ``layer_norm`` (the model's final
  norm; the backbone has none); an optional ``dinov3_convnext.`` prefix.
"""
import re

from .layouts import (StateDict, has_key, register_init_only, register_layout, rename_keys,
                      strip_model_prefix)

_OURS = r'^layers\.\d+\.blocks\.\d+\.dwconv\.weight$'
_OFFICIAL = r'^stages\.\d+\.\d+\.dwconv\.weight$'
_HF = r'^(dinov3_convnext\.)?stages\.\d+\.layers\.\d+\.depthwise_conv\.weight$'
_BLOCK = (
    (r'\.pwconv1\.', '.mlp.fc1.'), (r'\.pwconv2\.', '.mlp.fc2.'), (r'\.gamma$', '.ls.gamma'),
    (r'\.depthwise_conv\.', '.dwconv.'), (r'\.layer_norm\.', '.norm.'),
    (r'\.pointwise_conv1\.', '.mlp.fc1.'), (r'\.pointwise_conv2\.', '.mlp.fc2.'),
)


def _downsample(key: str) -> str:
    """``downsample_layers.{i}.{n}.`` (or HF ``stages.{i}.downsample_layers.{n}.``) -> ours:
    stage 0 is conv (0), norm (1); the later ones norm (0), conv (1)."""
    match = re.match(r'^(?:downsample_layers\.(\d+)|stages\.(\d+)\.downsample_layers)\.(\d)\.(.*)$',
                     key)
    if not match:
        return key
    stage = int(match.group(1) or match.group(2))
    first = 'proj' if stage == 0 else 'norm'
    part = first if match.group(3) == '0' else ({'proj', 'norm'} - {first}).pop()
    return f'layers.{stage}.downsample.{part}.{match.group(4)}'


def convert_official_convnext(state_dict: StateDict) -> StateDict:
    """facebookresearch/dinov3 (and facebookresearch/ConvNeXt) -> ours (see the module).
    Others unchanged."""
    if not has_key(state_dict, _OFFICIAL):
        return dict(state_dict)
    out = rename_keys(state_dict, ((r'^stages\.(\d+)\.(\d+)\.', r'layers.\1.blocks.\2.'),
                                   *_BLOCK),
                      drop=lambda k: k.startswith(('norms.', 'head.')))
    return {_downsample(k): v for k, v in out.items()}


def convert_hf_convnext(state_dict: StateDict) -> StateDict:
    """transformers ``DINOv3ConvNextModel`` / ``DINOv3ConvNextBackbone`` -> ours (see the
    module). Others unchanged."""
    state_dict = strip_model_prefix(state_dict, 'dinov3_convnext.')
    if not has_key(state_dict, _HF):
        return dict(state_dict)
    out = rename_keys(state_dict, ((r'^stages\.(\d+)\.layers\.(\d+)\.', r'layers.\1.blocks.\2.'),
                                   (r'^layer_norm\.', 'norm.'), *_BLOCK))
    return {_downsample(k): v for k, v in out.items()}


register_layout('mmvit_ext ConvNeXt', 'convnext', _OURS, ours=True)
register_layout('official DINOv3 ConvNeXt (facebookresearch/dinov3)', 'convnext', _OFFICIAL,
                convert_official_convnext)
register_layout('Hugging Face transformers DINOv3 ConvNeXt (DINOv3ConvNextModel)', 'convnext',
                _HF, convert_hf_convnext)
# transformers' DINOv3ConvNextBackbone holds no final norm: out_norm keeps it initialised
register_init_only('convnext', r'^norm\.')
