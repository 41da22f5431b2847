"""Every layout into every family that has it, on every load path, against the layout's own
implementation (timm, transformers, mmdet, mmseg, mmpretrain from the venv, random weights).

``pytest -s tests/test_layouts.py`` prints the layout x family table of max feature differences.
"""
import re

import pytest
import torch

import mmvit_ext  # noqa: F401
from mmvit_ext.converters import CheckpointError, convert_for_model, unwrap_state_dict
from mmvit_ext.converters.layouts import detect_layout

import timm  # noqa: F401  (test-only, pinned in requirements/dev.txt: missing fails)
import transformers  # noqa: F401
import layout_peers as peers

TOL = 1e-4
ROWS = []


@pytest.fixture(scope='module')
def cases():
    return peers.all_cases()


def test_every_family_with_a_foreign_layout_has_a_case(cases):
    """Families from the registry, layouts from the converters: a family whose checkpoints come
    in a layout other than ours is tested against that layout's implementation here."""
    from mmvit_ext.backbones import family_classes
    from mmvit_ext.converters import LAYOUTS
    foreign = {lay.family for lay in LAYOUTS if not lay.ours} & set(family_classes())
    assert foreign <= {family for family, _ in cases}, foreign - {family for family, _ in cases}


def _max_diff(ours, reference, x):
    with torch.no_grad():
        got, want = ours.eval()(x), reference(x)
    assert len(got) == len(want)
    return max((a - b).abs().max().item() for a, b in zip(got, want))


def test_every_layout_on_init_cfg_and_load_state_dict(cases, tmp_path):
    for (family, name), case in cases.items():
        path = tmp_path / (family + re.sub(r'\W+', '_', name) + '.pth')
        torch.save(case.checkpoint, path)
        x = torch.randn(2, 3, case.image, case.image)
        via_init = peers.build_ours(case.ours, dict(type='Pretrained', checkpoint=str(path)))
        via_init.init_weights()
        assert case.layout in via_init.load_report.layout, (name, via_init.load_report.layout)
        state = case.checkpoint if 'state_dict' not in case.checkpoint else \
            case.checkpoint['state_dict']  # a plain state dict; a whole model's backbone.* keys
        via_plain = peers.build_ours(case.ours)
        via_plain.load_state_dict(state)  # strict=True: every key accounted for
        diffs = (_max_diff(via_init, case.features, x), _max_diff(via_plain, case.features, x))
        ROWS.append((family, name, via_init.load_report.layout, *diffs))
        assert max(diffs) <= TOL, (family, name, diffs)
    _print_table()


def _print_table():
    print('\n\n| family | checkpoint (peer implementation) | detected layout | max diff, init_cfg '
          '| max diff, load_state_dict |\n|---|---|---|---|---|')
    for family, name, layout, a, b in ROWS:
        print(f'| {family} | {name} | {layout} | {a:.1e} | {b:.1e} |')


def test_converters_are_idempotent_and_ours_is_a_no_op(cases):
    for (family, name), case in cases.items():
        model = peers.build_ours(case.ours)
        once, layout = convert_for_model(model, unwrap_state_dict(case.checkpoint))
        twice, again = convert_for_model(model, once)
        assert again.startswith('mmvit_ext'), (name, again)
        assert once.keys() == twice.keys() and all(once[k] is twice[k] for k in once), name
        converter = detect_layout(unwrap_state_dict(case.checkpoint), family).convert
        assert converter(once).keys() == once.keys(), name  # our dict passes through unchanged


def test_each_converter_leaves_other_layouts_unchanged(cases):
    from mmvit_ext.converters import LAYOUTS
    for (family, name), case in cases.items():
        raw = unwrap_state_dict(case.checkpoint)
        own = detect_layout(raw, family)
        for layout in (lay for lay in LAYOUTS if lay.family == family and lay is not own):
            assert not layout.matches(raw), (name, layout.name)  # detection is unambiguous
            assert layout.convert(raw).keys() == raw.keys(), (name, layout.name)


def test_timm_and_official_layouts_agree_with_timms_converter(cases):
    """Our official dicts are timm's run backwards: timm's own converter takes them forwards."""
    from timm.models.pvt_v2 import checkpoint_filter_fn as pvt_filter
    from timm.models.swin_transformer import checkpoint_filter_fn as swin_filter
    swin = peers.timm_swin()
    official = cases[('swin', 'official')].checkpoint['model']
    forward = swin_filter({'model': dict(official)}, swin)
    assert forward.keys() == cases[('swin', 'timm')].checkpoint.keys()
    timm_pvt = cases[('pvtv2', 'timm')].checkpoint
    assert pvt_filter(dict(cases[('pvtv2', 'official')].checkpoint), None).keys() == timm_pvt.keys()


def test_mmvit_ext_layouts_load_unchanged():
    ours = peers.build_ours(peers._swin_ours()).eval()
    state = ours.state_dict()
    v01 = {re.sub(r'\.attn\.rel_pos\.', '.rel_pos.', k): v for k, v in state.items()}
    for checkpoint, layout in ((state, 'mmvit_ext Swin'), (v01, 'mmvit_ext 0.1 Swin')):
        target = peers.build_ours(peers._swin_ours())
        target.load_state_dict(checkpoint)
        assert target.load_report.layout == layout and not target.load_report.missing
        x = torch.randn(1, 3, 64, 64)
        assert _max_diff(target, ours, x) == 0


def test_whole_mmdet_detector_checkpoint_into_our_detector(tmp_path):
    """load_state_dict(strict=True) and mmengine's load_checkpoint (the load_from / resume /
    tools/test.py path) convert the backbone.* keys; the neck then sees the same maps."""
    from mmengine.runner.checkpoint import load_checkpoint
    mmdet = peers.mmdet_swin_detector(seed=5)
    path = tmp_path / 'mask_rcnn_swin.pth'
    torch.save({'state_dict': mmdet.state_dict(), 'meta': {}}, path)
    x = torch.randn(1, 3, peers.SWIN_IMG, peers.SWIN_IMG)
    with torch.no_grad():
        want = mmdet.neck(mmdet.backbone(x))
    for load in ('load_state_dict', 'load_checkpoint'):
        ours = peers.our_swin_detector()
        if load == 'load_state_dict':
            ours.load_state_dict(torch.load(path)['state_dict'])
        else:
            load_checkpoint(ours, str(path), map_location='cpu', strict=False)
        assert 'OpenMMLab Swin' in ours.backbone.load_report.layout
        with torch.no_grad():
            got = ours.neck(ours.eval().backbone(x))
        assert max((a - b).abs().max().item() for a, b in zip(got, want)) <= TOL, load

    # a backbone of another depth: loud on both paths (mmengine would skip it with a warning)
    state = {k: v for k, v in mmdet.state_dict().items()
             if not k.startswith('backbone.stages.2.blocks.1.')}
    torch.save({'state_dict': state}, path)
    with pytest.raises(CheckpointError, match=r'leaves 13 of \d+ SwinTransformer tensors '
                                              r'unloaded.*layers\.2\.blocks\.1\.'):
        peers.our_swin_detector().load_state_dict(state)
    with pytest.raises(CheckpointError, match='leaves 13 of'):
        load_checkpoint(peers.our_swin_detector(), str(path), map_location='cpu', strict=False)


def test_whole_mmseg_upernet_checkpoint_into_our_segmentor(tmp_path):
    mmseg = peers.mmseg_swin_upernet(seed=6)
    ours = peers.our_swin_upernet()
    ours.load_state_dict(mmseg.state_dict())
    assert 'OpenMMLab Swin' in ours.backbone.load_report.layout
    x = torch.randn(1, 3, peers.SWIN_IMG, peers.SWIN_IMG)
    with torch.no_grad():
        want = mmseg.decode_head(mmseg.backbone(x))
        got = ours.decode_head(ours.backbone(x))
    assert (got - want).abs().max().item() <= TOL


def test_every_registered_family_has_its_own_layout_registered():
    """Layouts come from the converter modules, families from the registry: each family's own
    key layout is known, so its checkpoints convert as a no-op on every load path."""
    from mmvit_ext.backbones import registered_families
    from mmvit_ext.converters import LAYOUTS
    ours = {layout.family for layout in LAYOUTS if layout.ours}
    assert set(registered_families()) <= ours, set(registered_families()) - ours
