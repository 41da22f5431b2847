"""Convert an official checkpoint of any supported family to the mmvit_ext layout.

Reads ``.pth`` / ``.pth.tar`` / ``.safetensors`` safely (weights only), unwraps
``model`` / ``state_dict`` / ``state_dict_ema``, strips ``module.`` / ``backbone.``, detects the
official layout (Swin, PVTv2, CaiT, DeepViT, Refined-ViT), converts it and writes ``.pth`` or
``.safetensors`` (by the output suffix). Prints what happened to the keys. A checkpoint whose
layout it cannot recognise is refused, naming the keys it saw.

Example:
    python tools/convert_checkpoint.py checkpoints/S24_224.pth checkpoints/cait_s24_mmvit.safetensors
    python tools/convert_checkpoint.py swin_tiny_patch4_window7_224.pth swin_t.pth --family swin
"""
import argparse
import sys
from collections import Counter

import mmvit_ext  # noqa: F401  (registers the layouts and the safe unpickler)
from mmvit_ext.converters import (CheckpointError, detect_layouts, read_checkpoint,
                                  save_state_dict, unwrap_state_dict)


def convert(src: str, dst: str, family: str = None) -> str:
    """Convert ``src`` into ``dst``; returns the printed summary. Raises CheckpointError."""
    state_dict = unwrap_state_dict(read_checkpoint(src), source=f'checkpoint {src}')
    layouts = [lay for lay in detect_layouts(state_dict) if lay.convert is not None]
    if family is not None:
        layouts = [lay for lay in layouts if lay.family == family]
    if not layouts:
        seen = sorted(state_dict)[:8]
        wanted = f' of family {family!r}' if family else ''
        raise CheckpointError(
            f'checkpoint {src}: no known official layout{wanted} recognised ({len(state_dict)} '
            f'tensors; first keys: {seen}); supported: official Swin, PVTv2, CaiT, DeepViT, '
            f'Refined-ViT')
    if len({lay.family for lay in layouts}) > 1:
        raise CheckpointError(f'checkpoint {src} matches several layouts '
                              f'{[lay.name for lay in layouts]}; pass --family')
    layout = layouts[0]
    converted = layout.convert(state_dict)
    save_state_dict(converted, dst)
    renamed = sum(1 for k in converted if k not in state_dict)
    dropped = sorted(k for k in state_dict if k.startswith(('head.', 'aux_head.', 'head_dist.'))
                     or k.endswith(('relative_position_index', 'attn_mask')))
    groups = Counter(k.split('.')[0] for k in converted)
    lines = [f'{src}: {layout.name} -> {dst}',
             f'  {len(state_dict)} tensors in, {len(converted)} out, {renamed} renamed, '
             f'{len(state_dict) - len(converted)} dropped',
             '  out groups: ' + ', '.join(f'{g} ({n})' for g, n in sorted(groups.items()))]
    if dropped:
        lines.append(f'  dropped (classifier heads, saved buffers): {", ".join(dropped)}')
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='official checkpoint file')
    parser.add_argument('dst', help='output file: .pth or .safetensors')
    parser.add_argument('--family', choices=('swin', 'pvtv2', 'cait', 'deepvit', 'refiner'),
                        help='only accept this family\'s layout')
    args = parser.parse_args()
    try:
        print(convert(args.src, args.dst, args.family))
    except CheckpointError as error:
        sys.exit(f'error: {error}')


if __name__ == '__main__':
    main()
