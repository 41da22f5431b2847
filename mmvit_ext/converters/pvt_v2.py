"""Official whai362/PVT (v2) checkpoints -> our PyramidVisionTransformerV2 layout."""
import re

from .layouts import StateDict, register_layout

_OFFICIAL = re.compile(r'^(patch_embed|block|norm)(\d)\.(.*)$')


def convert_official_pvtv2(state_dict: StateDict) -> StateDict:
    """``patch_embed{n}.`` / ``block{n}.{j}.`` / ``norm{n}.`` -> ``layers.{n-1}.patch_embed.`` /
    ``.blocks.{j}.`` / ``.norm.``; ``mlp.dwconv.dwconv`` -> ``mlp.dwconv``; the head is dropped.
    Already-converted dicts come back unchanged."""
    if not any(k.startswith('block1.') for k in state_dict):
        return dict(state_dict)
    out = {}
    for key, value in state_dict.items():
        if key.startswith('head.'):
            continue
        match = _OFFICIAL.match(key)
        if match:
            part, stage, rest = match.groups()
            part = 'blocks' if part == 'block' else part
            key = f'layers.{int(stage) - 1}.{part}.{rest}'
        out[key.replace('.mlp.dwconv.dwconv.', '.mlp.dwconv.')] = value
    return out


register_layout('official PVTv2 (whai362/PVT)', 'pvtv2', r'^block1\.0\.attn\.q\.weight$',
                convert_official_pvtv2)


_OURS = re.compile(r'^layers\.(\d+)\.(patch_embed|blocks|norm)\.(.*)$')


def export_official_pvtv2(state_dict: StateDict) -> StateDict:
    """Inverse of :func:`convert_official_pvtv2` (for peers that read the official layout)."""
    out = {}
    for key, value in state_dict.items():
        match = _OURS.match(key)
        if match:
            stage, part, rest = match.groups()
            part = 'block' if part == 'blocks' else part
            key = f'{part}{int(stage) + 1}.{rest}'
        out[key.replace('.mlp.dwconv.', '.mlp.dwconv.dwconv.')] = value
    return out
