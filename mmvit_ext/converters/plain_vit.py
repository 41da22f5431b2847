"""Official CaiT (facebookresearch/deit), DeepViT (zhoudaquan/dvit_repo) and Refined-ViT
(zhoudaquan/Refiner_ViT) checkpoints -> our plain-ViT layouts, and back.

The trunks already share our names (``patch_embed``, ``pos_embed``, ``blocks.{i}.attn.qkv``,
``norm``...); what differs is LayerScale (``gamma_1/2``, ``mlp.scale_channel``), the map
transforms and CaiT's class-attention blocks. Classifier heads are dropped.
"""
import re
from typing import Dict, Iterable, Tuple

from .layouts import StateDict, register_init_only, register_layout

_HEADS = ('head.', 'aux_head.', 'head_dist.')


def _rename(state_dict: StateDict, rules: Iterable[Tuple[str, str]]) -> StateDict:
    out = {}
    for key, value in state_dict.items():
        if key.startswith(_HEADS):
            continue
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


_CAIT = (
    (r'^blocks_token_only\.', 'cls_blocks.'),
    (r'\.gamma_1$', '.ls1.gamma'),
    (r'\.gamma_2$', '.ls2.gamma'),
    (r'\.attn\.proj_l\.', '.attn.map_transforms.0.proj.'),
    (r'\.attn\.proj_w\.', '.attn.map_transforms.1.proj.'),
)


def convert_official_cait(state_dict: StateDict) -> StateDict:
    """``gamma_1/2`` -> ``ls1/2.gamma``; ``attn.proj_l/proj_w`` (talking heads before / after the
    softmax) -> ``attn.map_transforms.0/1.proj``; ``blocks_token_only`` -> ``cls_blocks``."""
    if not any(k.endswith('.attn.proj_l.weight') or k.startswith('blocks_token_only.')
               for k in state_dict):
        return dict(state_dict)
    return _rename(state_dict, _CAIT)


_DEEPVIT = (
    (r'\.attn\.reatten_matrix\.', '.attn.map_transforms.0.mix.'),
    (r'\.attn\.var_norm\.', '.attn.map_transforms.0.norm.'),
)


def convert_official_deepvit(state_dict: StateDict) -> StateDict:
    """``attn.reatten_matrix`` (1x1 conv over heads) / ``attn.var_norm`` (BatchNorm over heads)
    -> ``attn.map_transforms.0.mix`` / ``.norm``."""
    if not any('.attn.reatten_matrix.' in k for k in state_dict):
        return dict(state_dict)
    return _rename(state_dict, _DEEPVIT)


def convert_official_refiner(state_dict: StateDict) -> StateDict:
    """``attn.DLA.*`` / ``attn.adapt_bn`` -> ``attn.refine.*`` / ``attn.refine.adapt_bn``; in
    shared blocks (those with a DLA) the value-only ``attn.qkv`` -> ``attn.v``;
    ``mlp.scale_channel`` -> ``ls2.gamma``; ``head`` and ``aux_head`` are dropped."""
    if not any('.attn.DLA.' in k for k in state_dict):
        return dict(state_dict)
    shared = {m.group(1) for k in state_dict if (m := re.match(r'^(blocks\.\d+)\.attn\.DLA\.', k))}
    rules = ((r'\.attn\.DLA\.', '.attn.refine.'), (r'\.attn\.adapt_bn\.', '.attn.refine.adapt_bn.'),
             (r'\.mlp\.scale_channel$', '.ls2.gamma'))
    out = {}
    for key, value in _rename(state_dict, rules).items():
        block = re.match(r'^(blocks\.\d+)\.attn\.qkv\.', key)
        if block and block.group(1) in shared:
            key = key.replace('.attn.qkv.', '.attn.v.')
        out[key] = value
    return out


def _invert(state_dict: StateDict, pairs: Dict[str, str]) -> StateDict:
    out = {}
    for key, value in state_dict.items():
        for ours, theirs in pairs.items():
            key = re.sub(ours, theirs, key)
        out[key] = value
    return out


def export_official_cait(state_dict: StateDict) -> StateDict:
    """Inverse of :func:`convert_official_cait` (without the head)."""
    return _invert(state_dict, {r'^cls_blocks\.': 'blocks_token_only.', r'\.ls1\.gamma$': '.gamma_1',
                                r'\.ls2\.gamma$': '.gamma_2',
                                r'\.attn\.map_transforms\.0\.proj\.': '.attn.proj_l.',
                                r'\.attn\.map_transforms\.1\.proj\.': '.attn.proj_w.'})


def export_official_deepvit(state_dict: StateDict) -> StateDict:
    """Inverse of :func:`convert_official_deepvit` (without the head)."""
    return _invert(state_dict, {r'\.attn\.map_transforms\.0\.mix\.': '.attn.reatten_matrix.',
                                r'\.attn\.map_transforms\.0\.norm\.': '.attn.var_norm.'})


def export_official_refiner(state_dict: StateDict) -> StateDict:
    """Inverse of :func:`convert_official_refiner` (without the heads)."""
    return _invert(state_dict, {r'\.attn\.refine\.adapt_bn\.': '.attn.adapt_bn.',
                                r'\.attn\.refine\.': '.attn.DLA.', r'\.attn\.v\.': '.attn.qkv.',
                                r'\.ls2\.gamma$': '.mlp.scale_channel'})


register_layout('mmvit_ext CaiT', 'cait', r'^blocks\.\d+\.attn\.map_transforms\.0\.proj\.weight$',
                ours=True)
register_layout('mmvit_ext DeepViT', 'deepvit',
                r'^blocks\.\d+\.attn\.map_transforms\.0\.mix\.weight$', ours=True)
register_layout('mmvit_ext Refined-ViT', 'refiner', r'^blocks\.\d+\.attn\.refine\.', ours=True)
# timm's CaiT keeps the official names (timm.models.cait): one layout
register_layout('official CaiT (facebookresearch/deit; timm.models.cait, same keys)', 'cait',
                r'^(blocks\.\d+\.attn\.proj_l\.weight|blocks_token_only\.0\.)',
                convert_official_cait)
register_layout('official DeepViT (zhoudaquan/dvit_repo)', 'deepvit',
                r'^blocks\.\d+\.attn\.reatten_matrix\.weight$', convert_official_deepvit)
register_layout('official Refined-ViT (zhoudaquan/Refiner_ViT)', 'refiner',
                r'^blocks\.\d+\.attn\.DLA\.', convert_official_refiner)
for _family in ('cait', 'deepvit', 'refiner'):
    register_init_only(_family, r'^pyramid\.')  # the dense pyramid is never in a classifier
