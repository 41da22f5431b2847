"""What ``tools/convert_checkpoint.py`` converts: a backbone checkpoint of one recognised layout,
or a whole-model checkpoint of a known foreign layout (the official DINOv3 segmentor: adapter +
Mask2Former head) -> an OpenMMLab model checkpoint."""
from collections import Counter
from typing import Optional

from .io import CheckpointError, read_checkpoint, save_state_dict, unwrap_state_dict
from .layouts import LAYOUTS, Layout, StateDict, convert_model_layout, detect_layouts


def convert_model(src: str, dst: str, state_dict: dict, trunk: Optional[str]) -> Optional[str]:
    """A whole-model checkpoint of a known foreign layout (the official DINOv3 segmentor) ->
    an OpenMMLab model checkpoint (``backbone.*``, ``decode_head.*``), ``trunk``'s weights (any
    layout of the trunk's family) merged under ``backbone.``; the summary, or ``None`` for
    other checkpoints."""
    converted, layout = convert_model_layout(state_dict)
    if layout is None:
        return None
    lines = [f'{src}: detected layout: {layout} -> {dst}',
             f'  {len(state_dict)} tensors in, {len(converted)} out, '
             f'{len(state_dict) - len(converted)} dropped']
    if trunk is not None:
        trunk_state = unwrap_state_dict(read_checkpoint(trunk), source=f'checkpoint {trunk}')
        trunk_layout = next((lay for lay in detect_layouts(trunk_state)
                             if lay.family == 'vit' and lay.convert is not None), None)
        if trunk_layout is None:
            raise CheckpointError(f'--trunk {trunk}: not a ViT trunk checkpoint of a known layout')
        merged = trunk_layout.convert(trunk_state)
        lines.append(f'  trunk {trunk} ({trunk_layout.name}): {len(merged)} tensors under '
                     f'backbone.')
        converted = {**{f'backbone.{k}': v for k, v in merged.items()}, **converted}
    else:
        lines.append('  no trunk in this file: pass --trunk, or load the trunk first (the '
                     "backbone's init_cfg) and this file as load_from")
    groups = Counter(k.split('.')[0] for k in converted)
    lines.append('  out groups: ' + ', '.join(f'{g} ({n})' for g, n in sorted(groups.items())))
    save_state_dict(converted, dst)
    return '\n'.join(lines)


def single_layout(state_dict: StateDict, source: str, family: Optional[str] = None) -> Layout:
    """The one converting layout ``state_dict`` is in (of ``family`` if given); raises naming
    the keys seen and the layouts known, or the several that match."""
    layouts = [lay for lay in detect_layouts(state_dict) if lay.convert is not None
               and (family is None or lay.family == family)]
    if not layouts:
        wanted = f' of family {family!r}' if family else ''
        raise CheckpointError(
            f'{source}: no known layout{wanted} recognised ({len(state_dict)} tensors; first '
            f'keys: {sorted(state_dict)[:8]}); known layouts: '
            + '; '.join(lay.name for lay in LAYOUTS if not lay.ours))
    if len({lay.family for lay in layouts}) > 1:
        raise CheckpointError(f'{source} matches several layouts '
                              f'{[lay.name for lay in layouts]}; pass --family')
    return layouts[0]
