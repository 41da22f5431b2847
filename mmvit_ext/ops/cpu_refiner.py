"""CPU inference kernel for :class:`~mmvit_ext.layers.RefinerMap` (Refined-ViT).

The module's own forward runs four BatchNorms, two ReLU6 and a residual over (B, r*H, N, M)
maps in NCHW, where oneDNN's depthwise convolution and every elementwise pass stream the whole
expanded map through memory (at 800x1216 a global map is 12 x 3800 x 3800: 2 GB expanded).
At inference the kernel computes the same function with

* every BatchNorm and the output ``scale`` folded into the convolutions' weights and biases,
  computed from the module's parameters and running statistics on each call (nothing cached,
  nothing written back into the module);
* the convolutions in channels-last layout (oneDNN's fast layout for 1x1 and depthwise), the
  ReLU6 clamps in place;
* chunks of map rows (with a halo of ``kernel_size // 2`` rows: the k x k convolution mixes
  neighbouring rows), so a chunk's expanded maps stay in cache and never exist whole.

Equal to the module's forward up to float32 rounding. Where it does not apply (training
statistics, gradients, another dtype or device, autocast) the module's forward runs.
"""
from typing import Dict, Iterator, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import flags
from ..layers.attention import fold_leading
from ..layers.attention import map_attention as map_attention_portable
from ..layers.map_transforms import RefinerMap

# Expanded-map elements per chunk (16 MB in float32: 16-32 rows of a 3800-token map measured
# fastest on a 2-core EPYC), and at least REFINER_MIN_ROWS rows so halo rows stay a small share.
REFINER_CHUNK_ELEMENTS = 2 ** 22
REFINER_MIN_ROWS = 16
# oneDNN's channels-last depthwise kernel vectorises 16 channels at a time: 36 channels run a
# slow generic path (15x slower, measured), so the expanded maps get zero channels up to 48.
CHANNEL_MULTIPLE = 16


def _bn_affine(bn: nn.BatchNorm2d) -> Tuple[torch.Tensor, torch.Tensor]:
    """Inference BatchNorm as ``gain * x + shift``, per channel."""
    gain = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        gain = gain * bn.weight
    shift = -bn.running_mean * gain
    if bn.bias is not None:
        shift = shift + bn.bias
    return gain, shift


def folded_weights(refiner: nn.Module) -> Dict[str, torch.Tensor]:
    """The refiner's convolutions with the BatchNorms and ``scale`` folded in, as matrices over
    ``hidden`` channels padded with zero channels to a multiple of :data:`CHANNEL_MULTIPLE`:
    ``out = pro @ relu6(dw(relu6(exp @ x + exp_bias)) + dw_bias) + pro_bias + residual_gain * x``
    per head (no ReLU6 after ``exp`` when the refiner does not expand: ``exp`` is the identity).
    """
    heads = refiner.conv_pro.out_channels
    hidden = refiner.depth_sep_conv.out_channels
    padded = -(-hidden // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE
    exp = torch.zeros(padded, heads)
    exp_bias = torch.zeros(padded)
    if refiner.expand:
        gain, shift = _bn_affine(refiner.bn1)
        exp[:hidden] = refiner.conv_exp.weight.view(hidden, heads) * gain[:, None]
        exp_bias[:hidden] = shift
    else:
        exp[:hidden] = torch.eye(heads)
    gain, shift = _bn_affine(refiner.bn2)
    dw = refiner.depth_sep_conv.weight.new_zeros(padded, *refiner.depth_sep_conv.weight.shape[1:])
    dw[:hidden] = refiner.depth_sep_conv.weight * gain.view(-1, 1, 1, 1)
    dw_bias = torch.zeros(padded)
    dw_bias[:hidden] = shift
    gain3, shift3 = _bn_affine(refiner.bn3)
    gain4, shift4 = _bn_affine(refiner.adapt_bn)
    out_gain = gain4 * refiner.scale  # adapt_bn(bn3(pro(y)) + x) * scale
    pro = torch.zeros(heads, padded)
    pro[:, :hidden] = refiner.conv_pro.weight.view(heads, hidden) * (gain3 * out_gain)[:, None]
    return dict(exp=exp, exp_bias=exp_bias, dw=dw, dw_bias=dw_bias, pro=pro,
                pro_bias=(shift3 * gain4 + shift4) * refiner.scale, residual_gain=out_gain)


def applies(refiner: nn.Module, attn: torch.Tensor) -> bool:
    """Inference with running statistics on float32 CPU maps, outside autocast."""
    norms = [m for m in refiner.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return (not torch.is_grad_enabled() and attn.device.type == 'cpu'
            and attn.dtype == torch.float32 and attn.dim() >= 3
            and not torch.is_autocast_enabled('cpu')
            and all(not m.training and m.running_mean is not None for m in norms))


def _chunks(maps: torch.Tensor, hidden: int):
    """(map slice, row slice) pairs: several whole maps per chunk where a map is small
    (windows), else row chunks of one map."""
    count, _, rows, cols = maps.shape
    per_map = hidden * rows * cols
    if per_map <= REFINER_CHUNK_ELEMENTS:
        step = REFINER_CHUNK_ELEMENTS // per_map
        for start in range(0, count, step):
            yield slice(start, min(start + step, count)), 0, rows
        return
    step = max(REFINER_MIN_ROWS, REFINER_CHUNK_ELEMENTS // (hidden * cols))
    for index in range(count):
        for start in range(0, rows, step):
            yield slice(index, index + 1), start, min(start + step, rows)


def _refined_chunks(refiner: nn.Module, maps: torch.Tensor
                    ) -> Iterator[Tuple[slice, int, int, torch.Tensor]]:
    """``(maps, first row, stop row, refined rows)`` over (G, H, N, M) ``maps``; the refined
    rows (count, H, rows, M) live in a buffer reused by the next chunk."""
    rows = maps.shape[-2]
    w = folded_weights(refiner)
    hidden, halo = w['dw'].shape[0], w['dw'].shape[-1] // 2
    used = refiner.depth_sep_conv.out_channels  # the rest are the zero padding channels
    chunks = list(_chunks(maps, hidden))
    # buffers reused by every chunk: a fresh multi-megabyte tensor per chunk costs page faults
    # on first touch, several times the product written into it (measured). The padding
    # channels of ``expanded`` stay zero: the products skip them, bias and clamp keep them 0.
    largest = max((i.stop - i.start) * (min(stop + halo, rows) - max(start - halo, 0))
                  for i, start, stop in chunks) * maps.shape[-1]
    expanded, refined = maps.new_zeros(largest * hidden), maps.new_empty(largest * maps.shape[1])
    for index, start, stop in chunks:
        first, last = max(start - halo, 0), min(stop + halo, rows)
        source = maps[index, :, first:last]
        count, heads, height, width = source.shape
        # (count, rows * cols, hidden) row-major: a channels-last image, as oneDNN wants it
        x = expanded[:count * height * width * hidden].view(count, -1, hidden)
        torch.matmul(source.reshape(count, heads, -1).transpose(1, 2), w['exp'][:used].t(),
                     out=x[..., :used])
        x = x.add_(w['exp_bias'])
        if refiner.expand:
            x = x.clamp_(0, 6)
        x = x.view(count, height, width, hidden).permute(0, 3, 1, 2)
        # "same" padding on the chunk; rows next to a cut are halo rows, sliced off
        x = F.conv2d(x, w['dw'], w['dw_bias'], padding=halo, groups=hidden).clamp_(0, 6)
        x = x[:, :, start - first:stop - first].permute(0, 2, 3, 1).reshape(count, -1, hidden)
        center = maps[index, :, start:stop]
        out = refined[:center.numel()].view(center.shape)
        torch.addcmul(w['pro_bias'].view(-1, 1, 1), center, w['residual_gain'].view(-1, 1, 1),
                      out=out)
        out.view(count, heads, -1).baddbmm_(w['pro'][:, :used].expand(count, heads, used),
                                            x[..., :used].transpose(1, 2))
        yield index, start, stop, out


def refiner_kernel(refiner: nn.Module, attn: torch.Tensor) -> torch.Tensor:
    """The module's own forward for :class:`~mmvit_ext.layers.RefinerMap`: the folded,
    channels-last, row-chunked computation at inference (:func:`applies`)."""
    if not applies(refiner, attn):
        return type(refiner).forward(refiner, attn)
    maps = fold_leading(attn)  # (prod(...), H, N, M)
    out = torch.empty_like(maps)
    for index, start, stop, refined in _refined_chunks(refiner, maps):
        out[index, :, start:stop] = refined
    return out.view(attn.shape)


def map_attention(attn, v, dropout_p=0.0, transforms=(), attn_map=None, return_map=False):
    """:func:`~mmvit_ext.layers.map_attention` through one :class:`RefinerMap` at inference
    with each chunk of refined rows applied to the values at once (the refined map never
    exists whole), else ``NotImplemented``. Not under ``flags.fused_attention(False)``, which
    promises ``attn_map`` hooks whole maps."""
    if (return_map or dropout_p > 0 or len(transforms) != 1
            or type(transforms[0]) is not RefinerMap or not flags.fused_attention.get()
            or not applies(transforms[0], attn) or v.dtype != attn.dtype):
        return NotImplemented
    maps, values = fold_leading(attn), fold_leading(v).contiguous()
    out = values.new_empty(*maps.shape[:-1], values.shape[-1])
    for index, start, stop, refined in _refined_chunks(transforms[0], maps):
        if attn_map is not None:
            refined = attn_map(refined)
        torch.matmul(refined, values[index], out=out[index, :, start:stop])
    return out.view(*v.shape[:-2], *out.shape[-2:])


def carried_explicit_attention(q, k, v, scale, attn_bias=None, dropout_p=0.0, transforms=(),
                               attn_map=None, carried_map=None, return_map=False):
    """:func:`~mmvit_ext.layers.explicit_attention` for a map carried on to a later block
    (``return_map``, Refined-ViT's computing blocks) at float32 inference without map
    transforms or bias: the probabilities are written in row chunks into the one returned map,
    through a reused logits buffer (two fresh whole-map tensors, logits and softmax, cost
    their size in page faults). Else ``NotImplemented``."""
    if (not return_map or transforms or attn_bias is not None or dropout_p > 0
            or torch.is_grad_enabled() or q.device.type != 'cpu' or q.dtype != torch.float32
            or k.dtype != q.dtype or not flags.fused_attention.get()
            or (carried_map is not None and carried_map.shape[-2:] != (q.shape[-2], k.shape[-2]))):
        return NotImplemented
    queries, keys = fold_leading(q), fold_leading(k).contiguous()
    maps = queries.new_empty(*queries.shape[:-1], keys.shape[-2])
    carried = None if carried_map is None else fold_leading(
        carried_map.expand(*q.shape[:-2], *carried_map.shape[-2:]))
    rows = max(1, REFINER_CHUNK_ELEMENTS // (maps.shape[0] * maps.shape[1] * maps.shape[-1]))
    logits, probs = (maps.new_empty(maps.shape[0] * maps.shape[1] * rows * maps.shape[-1])
                     for _ in range(2))
    for start in range(0, maps.shape[-2], rows):
        chunk = queries[:, :, start:start + rows]
        part = torch.matmul(chunk * scale, keys.transpose(-2, -1),
                            out=logits[:chunk[..., 0].numel() * keys.shape[-2]].view(
                                *chunk.shape[:-1], keys.shape[-2]))
        target = maps[:, :, start:start + rows]
        if target.is_contiguous():
            torch.ops.aten._softmax.out(part, -1, False, out=target)
        else:  # a softmax out= kernel writes its output contiguously
            target.copy_(torch.ops.aten._softmax.out(part, -1, False, out=probs[:part.numel()]
                                                     .view(part.shape)))
        if carried is not None:
            target.add_(carried[:, :, start:start + rows])
    maps = maps.view(*q.shape[:-1], k.shape[-2])
    return map_attention_portable(maps, v, dropout_p, transforms, attn_map, return_map)


__all__ = ['refiner_kernel', 'map_attention', 'carried_explicit_attention', 'folded_weights', 'applies',
           'REFINER_CHUNK_ELEMENTS', 'REFINER_MIN_ROWS', 'CHANNEL_MULTIPLE']
