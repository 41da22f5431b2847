"""The official DINOv3 ConvNeXt written from its semantics (facebookresearch/dinov3,
``dinov3/models/convnext.py``) as functions of an official-layout state dict, for parity tests
without the official code: ``get_intermediate_layers(x, n=4, reshape=True, norm=...)``, the
official hub key layout (random values), and the transformers ``DINOv3ConvNextModel`` layout."""
import re
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

TINY = dict(embed_dims=(16, 24, 32, 48), depths=(1, 2, 2, 1))
StateDict = Dict[str, torch.Tensor]


def official_state_dict(embed_dims: Sequence[int], depths: Sequence[int], seed: int = 0
                        ) -> StateDict:
    """The hub file's keys, random values: gains near 1, LayerScale near 0.5 (not 1e-6, so the
    blocks move the maps); the final norm saved twice (``norm`` and ``norms.3``)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = 0.05, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std + mean

    sd: StateDict = {}
    for i, dim in enumerate(embed_dims):
        conv_in = 3 if i == 0 else embed_dims[i - 1]
        kernel = 4 if i == 0 else 2
        conv, norm = (0, 1) if i == 0 else (1, 0)
        norm_dim = dim if i == 0 else conv_in
        sd[f'downsample_layers.{i}.{conv}.weight'] = rand(dim, conv_in, kernel, kernel, std=0.2)
        sd[f'downsample_layers.{i}.{conv}.bias'] = rand(dim)
        sd[f'downsample_layers.{i}.{norm}.weight'] = rand(norm_dim, std=0.1, mean=1.0)
        sd[f'downsample_layers.{i}.{norm}.bias'] = rand(norm_dim)
        for j in range(depths[i]):
            p = f'stages.{i}.{j}.'
            sd.update({p + 'gamma': rand(dim, std=0.1, mean=0.5),
                       p + 'dwconv.weight': rand(dim, 1, 7, 7, std=0.1),
                       p + 'dwconv.bias': rand(dim),
                       p + 'norm.weight': rand(dim, std=0.1, mean=1.0), p + 'norm.bias': rand(dim),
                       p + 'pwconv1.weight': rand(4 * dim, dim, std=0.2),
                       p + 'pwconv1.bias': rand(4 * dim),
                       p + 'pwconv2.weight': rand(dim, 4 * dim, std=0.1),
                       p + 'pwconv2.bias': rand(dim)})
    sd['norm.weight'] = rand(embed_dims[-1], std=0.1, mean=1.0)
    sd['norm.bias'] = rand(embed_dims[-1])
    sd['norms.3.weight'], sd['norms.3.bias'] = sd['norm.weight'], sd['norm.bias']
    return sd


def _ln_channels_first(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The official ``LayerNorm(data_format='channels_first')``: mean and biased variance over
    C, eps 1e-6 inside the square root."""
    mean = x.mean(1, keepdim=True)
    var = (x - mean).pow(2).mean(1, keepdim=True)
    x = (x - mean) / torch.sqrt(var + 1e-6)
    return weight[:, None, None] * x + bias[:, None, None]


def _block(sd: StateDict, p: str, x: torch.Tensor) -> torch.Tensor:
    y = F.conv2d(x, sd[p + 'dwconv.weight'], sd[p + 'dwconv.bias'], padding=3, groups=x.shape[1])
    y = y.permute(0, 2, 3, 1)
    y = F.layer_norm(y, y.shape[-1:], sd[p + 'norm.weight'], sd[p + 'norm.bias'], 1e-6)
    y = F.linear(F.gelu(F.linear(y, sd[p + 'pwconv1.weight'], sd[p + 'pwconv1.bias'])),
                 sd[p + 'pwconv2.weight'], sd[p + 'pwconv2.bias'])
    return x + (sd[p + 'gamma'] * y).permute(0, 3, 1, 2)


def intermediate_layers(sd: StateDict, x: torch.Tensor, norm: bool = False
                        ) -> Tuple[torch.Tensor, ...]:
    """``get_intermediate_layers(x, n=4, reshape=True, norm=norm)``: the four stage maps; with
    ``norm`` the last one passes the final LayerNorm over its tokens (``norms[:3]`` are
    identities)."""
    outs: List[torch.Tensor] = []
    stages = 1 + max(int(k.split('.')[1]) for k in sd if k.startswith('stages.'))
    for i in range(stages):
        d = f'downsample_layers.{i}.'
        if i == 0:
            x = F.conv2d(x, sd[d + '0.weight'], sd[d + '0.bias'], stride=4)
            x = _ln_channels_first(x, sd[d + '1.weight'], sd[d + '1.bias'])
        else:
            x = _ln_channels_first(x, sd[d + '0.weight'], sd[d + '0.bias'])
            x = F.conv2d(x, sd[d + '1.weight'], sd[d + '1.bias'], stride=2)
        blocks = sorted({int(k.split('.')[2]) for k in sd if k.startswith(f'stages.{i}.')})
        for j in blocks:
            x = _block(sd, f'stages.{i}.{j}.', x)
        outs.append(x)
    if norm:
        b, c, h, w = outs[-1].shape
        tokens = outs[-1].flatten(2).transpose(1, 2)
        tokens = F.layer_norm(tokens, (c,), sd['norm.weight'], sd['norm.bias'], 1e-6)
        outs[-1] = tokens.transpose(1, 2).reshape(b, c, h, w)
    return tuple(outs)


_TO_HF = ((r'^stages\.(\d+)\.(\d+)\.dwconv\.', r'stages.\1.layers.\2.depthwise_conv.'),
          (r'^stages\.(\d+)\.(\d+)\.norm\.', r'stages.\1.layers.\2.layer_norm.'),
          (r'^stages\.(\d+)\.(\d+)\.pwconv(\d)\.', r'stages.\1.layers.\2.pointwise_conv\3.'),
          (r'^stages\.(\d+)\.(\d+)\.gamma$', r'stages.\1.layers.\2.gamma'),
          (r'^downsample_layers\.(\d+)\.', r'stages.\1.downsample_layers.'),
          (r'^norm\.', 'layer_norm.'))


def official_to_hf(sd: StateDict) -> StateDict:
    """transformers' ``convert_dinov3_convnext_to_hf`` key mapping (``DINOv3ConvNextModel``)."""
    out = {}
    for key, value in sd.items():
        if key.startswith('norms.'):
            continue
        for pattern, repl in _TO_HF:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out
