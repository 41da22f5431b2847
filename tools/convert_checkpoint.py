"""Convert a checkpoint of any known layout to the mmvit_ext layout, and check it loads back.

Reads ``.pth`` / ``.pth.tar`` / ``.safetensors`` (or an ``http(s)://`` URL, through the torch hub
cache) safely (weights only), unwraps ``model`` / ``state_dict`` / ``state_dict_ema``, strips
``module.`` / ``backbone.`` (a whole detector gives its backbone), names the layout it detected
(official, timm, Hugging Face, mmdet / mmseg / mmpretrain, mmvit_ext), converts it and writes
``.pth`` or ``.safetensors`` (by the output suffix). It then reads the written file back and
loads it into our backbone (``--arch``, or the architecture the family reads off the weights,
``BaseBackbone.infer_arch``), strictly: a file that would not load is an error. A checkpoint whose layout it
cannot recognise is refused, naming the keys it saw.

A whole official DINOv3 segmentor (``segmentation_model.0`` adapter, ``.1`` Mask2Former head)
becomes an mmseg checkpoint (``backbone.``, ``decode_head.``), every tensor kept; ``--trunk``
merges the trunk weights the released file leaves out, for tools/test.py.

Example:
    python tools/convert_checkpoint.py checkpoints/S24_224.pth cait_s24.safetensors --arch s24
    python tools/convert_checkpoint.py swin_tiny_patch4_window7_224.pth swin_t.pth --family swin
    python tools/convert_checkpoint.py dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth m2f.pth \
        --trunk dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth
"""
import argparse
import sys
from collections import Counter
from typing import Optional

import torch

import mmvit_ext  # noqa: F401  (registers the layouts and the safe unpickler)
from mmvit_ext.backbones import family_class, family_classes
from mmvit_ext.converters import (CheckpointError, read_checkpoint, save_state_dict,
                                  unwrap_state_dict)
from mmvit_ext.converters.whole_model import convert_model, single_layout


def load_back(dst: str, family: str, arch: Optional[str]) -> str:
    """Read ``dst`` back and load it strictly into our backbone; the line to print."""
    state_dict = unwrap_state_dict(read_checkpoint(dst), source=f'written file {dst}')
    settings = dict(arch=arch) if arch else family_class(family).infer_arch(state_dict)
    if settings is None:
        return f'  not load-checked: pass --arch to build the {family} model'
    cls = family_class(family)
    model = cls(**settings)
    model.load_state_dict(state_dict)  # converts nothing, raises on anything that does not fit
    report = model.load_report
    kept = f'; kept initialised (expected): {len(report.expected_missing)}' \
        if report.expected_missing else ''
    return (f'  load-checked: {dst} loads into {cls.__name__}({settings}) as '
            f'{report.layout!r}: {len(report.loaded)} tensors{kept}')


def convert(src: str, dst: str, family: Optional[str] = None, arch: Optional[str] = None,
            trunk: Optional[str] = None) -> str:
    """Convert ``src`` into ``dst``; returns the printed summary. Raises CheckpointError."""
    state_dict = unwrap_state_dict(read_checkpoint(src), source=f'checkpoint {src}')
    whole = convert_model(src, dst, state_dict, trunk)
    if whole is not None:
        return whole
    if trunk is not None:
        raise CheckpointError('--trunk applies to whole segmentor checkpoints only')
    layout = single_layout(state_dict, f'checkpoint {src}', family)
    converted = layout.convert(state_dict)
    save_state_dict(converted, dst)
    renamed = sum(1 for k in converted if k not in state_dict)
    dropped = sorted(k for k in state_dict if k.startswith(('head.', 'aux_head.', 'head_dist.',
                                                            'classifier.'))
                     or k.endswith(('relative_position_index', 'attn_mask')))
    groups = Counter(k.split('.')[0] for k in converted)
    note = ' (already ours: copied unchanged)' if layout.ours else ''
    lines = [f'{src}: detected layout: {layout.name}{note} -> {dst}',
             f'  {len(state_dict)} tensors in, {len(converted)} out, {renamed} renamed, '
             f'{len(state_dict) - len(converted)} dropped',
             '  out groups: ' + ', '.join(f'{g} ({n})' for g, n in sorted(groups.items()))]
    if dropped:
        lines.append(f'  dropped (classifier heads, saved buffers): {", ".join(dropped)}')
    lines.append(load_back(dst, layout.family, arch))
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='checkpoint file or http(s) URL')
    parser.add_argument('dst', help='output file: .pth or .safetensors')
    parser.add_argument('--family', choices=sorted(family_classes()),
                        help="only accept this family's layouts")
    parser.add_argument('--arch', help='our arch preset to load-check the output with (default: '
                                       'read off the weights where the family can)')
    parser.add_argument('--trunk', help='a whole segmentor checkpoint without its trunk (the '
                                        'official DINOv3 m2f file): the trunk weights to merge')
    args = parser.parse_args()
    try:
        print(convert(args.src, args.dst, args.family, args.arch, args.trunk))
    except (CheckpointError, RuntimeError) as error:
        sys.exit(f'error: {error}')


if __name__ == '__main__':
    torch.set_num_threads(1)
    main()
