"""One table of bad inputs across arguments, tensors, files and configs: each raises one error
whose message names the argument or file and what is allowed."""
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config

from mmvit_ext.backbones import PyramidVisionTransformerV2 as PVT
from mmvit_ext.backbones import SwinTransformer as Swin
from mmvit_ext.converters import CheckpointError, load_pretrained, read_checkpoint
from mmvit_ext.utils.config_checks import missing_data, missing_pretrained, neck_channel_mismatch
from official_layouts import official_pvtv2_state_dict, official_swin_state_dict

ROOT = Path(__file__).resolve().parents[1]
TINY_SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))
TINY_PVT = dict(embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 5, 8))


class _Evil:
    def __reduce__(self):
        return (print, ('should never run',))


def _file(tmp: Path, name: str, content) -> str:
    path = tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    return str(path)


def _truncated(tmp: Path) -> str:
    good = tmp / 'good.pth'
    torch.save({'model': official_swin_state_dict(16, (1, 1, 1, 1), (1, 2, 2, 4))}, good)
    return _file(tmp, 'truncated.pth', good.read_bytes()[:3000])


def _load(path: str, model=None, **kw):
    return load_pretrained(model or Swin(TINY_SWIN), path, **kw)


def _cfg(**changes):
    cfg = Config.fromfile(str(ROOT / 'configs/mask_rcnn_pvtv2_b2.py'))
    cfg.merge_from_dict(changes)
    return cfg


def _first(problems):
    assert problems, 'no problem reported'
    raise ValueError(problems[0])


CASES = [
    # --- arguments ---------------------------------------------------------------------------
    ('swin unknown arch', lambda t: Swin('tinyy'), ValueError, r"unknown arch 'tinyy'; choose one of"),
    ('pvt unknown arch', lambda t: PVT('b9'), ValueError, r"unknown arch 'b9'.*'b2_li'"),
    ('arch wrong type', lambda t: Swin(123), TypeError, 'arch must be a preset name or a dict'),
    ('custom arch missing keys', lambda t: Swin(dict(embed_dims=96)), ValueError,
     r"missing keys \['depths', 'num_heads'\]"),
    ('custom arch unknown key', lambda t: Swin(dict(TINY_SWIN, mlp=4)), ValueError,
     r"unknown keys \['mlp'\]"),
    ('custom arch stage count', lambda t: Swin(dict(TINY_SWIN, num_heads=(1, 2))), ValueError,
     'one entry per stage'),
    ('pvt sr_ratios length', lambda t: PVT(dict(TINY_PVT, sr_ratios=(8, 4))), ValueError,
     r'sr_ratios \(8, 4\) must have one entry per stage'),
    ('heads do not divide dims', lambda t: PVT(dict(TINY_PVT, num_heads=(3, 2, 5, 8))), ValueError,
     'dim 16 is not divisible by num_heads 3'),
    ('out_indices out of range', lambda t: Swin(TINY_SWIN, out_indices=(0, 4)), ValueError,
     r'out_indices entry 4 is out of range; valid indices are 0\.\.3'),
    ('out_indices duplicated', lambda t: Swin(TINY_SWIN, out_indices=(1, -3)), ValueError,
     r'out_indices \(1, -3\) has duplicates'),
    ('out_indices empty', lambda t: PVT(TINY_PVT, out_indices=()), TypeError, 'non-empty'),
    ('out_indices not int', lambda t: PVT(TINY_PVT, out_indices=(1.5,)), TypeError,
     'out_indices entries must be ints, got 1.5'),
    ('frozen_stages too deep', lambda t: Swin(TINY_SWIN, frozen_stages=5), ValueError,
     r'frozen_stages=5 is out of range; use -1 \(nothing frozen\) up to 4'),
    ('frozen_stages below -1', lambda t: PVT(TINY_PVT, frozen_stages=-2), ValueError,
     'frozen_stages=-2 is out of range'),
    ('window size zero', lambda t: Swin(TINY_SWIN, window_size=0), ValueError,
     'window_size must be a positive int, got 0'),
    ('window size negative', lambda t: Swin(TINY_SWIN, window_size=-7), ValueError,
     'window_size must be a positive int, got -7'),
    ('in_channels zero', lambda t: PVT(TINY_PVT, in_channels=0), ValueError,
     'in_channels must be a positive int, got 0'),
    ('drop_path_rate >= 1', lambda t: Swin(TINY_SWIN, drop_path_rate=1.5), ValueError,
     r'drop_path_rate must be in \[0, 1\), got 1.5'),
    # --- tensors -----------------------------------------------------------------------------
    ('wrong channel count', lambda t: Swin(TINY_SWIN)(torch.zeros(1, 4, 32, 32)), ValueError,
     'in_channels=3 but the input has 4 channels'),
    ('rank 3 input', lambda t: PVT(TINY_PVT)(torch.zeros(3, 32, 32)), ValueError,
     r'expects a \(B, 3, H, W\) tensor, got \(3, 32, 32\)'),
    ('rank 5 input', lambda t: Swin(TINY_SWIN)(torch.zeros(1, 1, 3, 32, 32)), ValueError,
     r'got \(1, 1, 3, 32, 32\)'),
    ('numpy input', lambda t: Swin(TINY_SWIN)(np.zeros((1, 3, 32, 32))), ValueError,
     'got ndarray'),
    ('image smaller than a patch', lambda t: PVT(TINY_PVT)(torch.zeros(1, 3, 3, 64)), ValueError,
     r'at least 4x4 pixels \(one patch\), got \(3, 64\)'),
    # --- files -------------------------------------------------------------------------------
    ('checkpoint of another family', lambda t: _load(_file(t, 'pvt.pth', official_pvtv2_state_dict(
        (16, 32, 40, 64), (1, 1, 1, 1)))), CheckpointError,
     r"official PVTv2 \(whai362/PVT\) checkpoint.*SwinTransformer loads 'swin'"),
    ('truncated checkpoint', lambda t: _load(_truncated(t)), CheckpointError,
     r'truncated\.pth.*truncated or not a torch'),
    ('empty checkpoint', lambda t: _load(_file(t, 'empty.pth', b'')), CheckpointError,
     r'empty \(0 bytes\).*empty\.pth'),
    ('missing checkpoint', lambda t: _load(str(t / 'nope.pth')), CheckpointError,
     r'checkpoint file not found: .*nope\.pth'),
    ('mismatched shapes', lambda t: _load(_file(t, 'big.pth', {'model': official_swin_state_dict(
        32, (1, 1, 1, 1), (1, 2, 2, 4))})), CheckpointError,
     r'shape mismatches; wrong arch\?\): patch_embed\.proj\.weight: checkpoint \(32, 3, 4, 4\)'),
    ('no tensors inside', lambda t: _load(_file(t, 'meta.pth', {'meta': {'epoch': 3}})),
     CheckpointError, r"holds no state dict of tensors.*saw \['meta'\]"),
    ('prefix matches nothing', lambda t: _load(_file(t, 'p.pth', {'model': official_swin_state_dict(
        16, (1, 1, 1, 1), (1, 2, 2, 4))}), prefix='backbone.'), CheckpointError,
     "no keys starting with prefix 'backbone.'"),
    ('unknown layout', lambda t: _load(_file(t, 'other.pth', {'fc.weight': torch.zeros(2, 2)})),
     CheckpointError, r"shares no key with SwinTransformer.*\['fc\.weight'\]"),
    ('pickled code', lambda t: read_checkpoint(_file(t, 'evil.pth', {'x': _Evil()})),
     CheckpointError, r'refused to load .*evil\.pth'),
    ('corrupt safetensors', lambda t: read_checkpoint(_file(t, 'bad.safetensors', b'\x08' + b'\x00' * 7 + b'garbage!')),
     CheckpointError, r'cannot read safetensors checkpoint .*bad\.safetensors'),
    ('Pretrained without path', lambda t: Swin(TINY_SWIN, init_cfg=dict(type='Pretrained')).init_weights(),
     ValueError, 'init_cfg of type Pretrained needs checkpoint=PATH'),
    # --- configs -----------------------------------------------------------------------------
    ('neck channels disagree', lambda t: _first(neck_channel_mismatch(_cfg(
        **{'model.neck.in_channels': [64, 128, 256, 512]}))), ValueError,
     r'model\.neck\.in_channels=\[64, 128, 256, 512\].*use in_channels=\[64, 128, 320, 512\]'),
    ('missing dataset root', lambda t: _first(missing_data(_cfg(
        **{'train_dataloader.dataset.data_root': str(t / 'coco')}), ('train',))), ValueError,
     r"train_dataloader\.dataset\.data_root: dataset root '.*coco' not found"),
    ('missing annotation file', lambda t: _first(missing_data(_cfg(
        **{'val_dataloader.dataset.data_root': str(t)}), ('val',))), ValueError,
     r"val_dataloader\.dataset\.ann_file: '.*instances_val2017\.json' not found"),
    ('missing pretrained weights', lambda t: _first(missing_pretrained(_cfg())), ValueError,
     r"model\.backbone\.init_cfg\.checkpoint: pretrained weights not found at 'checkpoints/pvt_v2_b2\.pth'"),
    ('unregistered scoped backbone', lambda t: _first(neck_channel_mismatch(_cfg(
        **{'model.backbone.type': 'mmvit_ext.NoSuchViT'}))), ValueError,
     r"'mmvit_ext\.NoSuchViT' is not registered in mmvit_ext"),
]


def test_table_has_at_least_30_distinct_cases():
    assert len({name for name, *_ in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize('name,make,exc,pattern', CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_one_clear_error(name, make, exc, pattern, tmp_path):
    with pytest.raises(exc, match=pattern):
        make(tmp_path)
