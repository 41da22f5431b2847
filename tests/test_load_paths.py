"""Strict loading (no silent partial loads), URLs offline, real training files, the conversion
tool: what a user meets on each load path."""
import argparse
import logging
import subprocess
import urllib.error
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger

import mmvit_ext  # noqa: F401  (registers backbones; our reader allowlists training state)
from mmvit_ext import torch_compat
from mmvit_ext.backbones import PyramidVisionTransformerV2, SwinTransformer
from mmvit_ext import flags
from mmvit_ext.converters import CheckpointError, read_checkpoint
from mmvit_ext.utils.config_checks import missing_pretrained
from official_layouts import official_swin_state_dict
from tool_runner import tool_process

ROOT = Path(__file__).resolve().parents[1]
PVT = dict(embed_dims=(16, 32, 64, 128), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8))


@pytest.fixture
def warnings_logged():
    """WARNING records of mmengine's current logger during the test."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_swin_t_checkpoint_into_swin_s_raises_with_counts_unless_opted_in(tmp_path,
                                                                         warnings_logged):
    path = tmp_path / 'swin_tiny_patch4_window7_224.pth'
    torch.save({'model': official_swin_state_dict()}, path)
    small = SwinTransformer('small', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    total = len(small.state_dict())
    with pytest.raises(CheckpointError, match=rf'leaves 156 of {total} SwinTransformer tensors '
                                              r'unloaded.*layers\.2\.blocks\.6\.'):
        small.init_weights()
    with pytest.raises(CheckpointError, match='leaves 156 of'):  # the plain path too
        small.load_state_dict(read_checkpoint(path)['model'])
    small.init_cfg['strict'] = False
    small.init_weights()
    assert len(small.load_report.missing) - len(small.load_report.expected_missing) == 156
    assert any('leaves 156 of' in r.getMessage() for r in warnings_logged)


def test_deeper_pvt_and_unexpected_keys(tmp_path, warnings_logged):
    source = PyramidVisionTransformerV2(dict(PVT, depths=(1, 2, 2, 1)))
    deeper = PyramidVisionTransformerV2(dict(PVT, depths=(1, 2, 3, 1)))
    with pytest.raises(CheckpointError, match=r'leaves 20 of \d+ .*layers\.2\.blocks\.2\.'):
        deeper.load_state_dict(source.state_dict())
    with flags.strict_loading(False):
        deeper.load_state_dict(source.state_dict())
    shallower = PyramidVisionTransformerV2(dict(PVT, depths=(1, 2, 1, 1)))
    with pytest.raises(CheckpointError, match=r'holds 20 tensors .* no place for: '
                                              r'layers\.2\.blocks\.1\.'):
        shallower.load_state_dict(source.state_dict())  # trunk tensors are never dropped quietly
    with flags.strict_loading(False):  # unless a partial load is asked for: then a warning
        shallower.load_state_dict(source.state_dict())
    assert len(shallower.load_report.unexpected) == 20
    assert any('20 keys unexpected' in r.getMessage() for r in warnings_logged)


def test_expected_misses_are_reported_as_expected(tmp_path):
    path = tmp_path / 'official.pth'
    torch.save({'model': official_swin_state_dict(16, (1, 1, 1, 1), (1, 2, 2, 4))}, path)
    model = SwinTransformer(dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
                            out_indices=(0, 1, 2))
    model.load_state_dict(read_checkpoint(path)['model'])  # strict=True passes
    report = model.load_report
    assert report.expected_missing == [f'norm{i}.{p}' for i in range(3) for p in ('bias', 'weight')]
    assert report.missing == report.expected_missing
    assert any(k.startswith('layers.3.') for k in report.dropped) and not report.unexpected
    assert 'kept initialised (expected' in report.summary()


URL = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_t_demo.pth'


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A private torch hub dir and no network."""
    hub = tmp_path / 'hub'
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(hub))

    def no_network(url, dst, *args, **kwargs):
        raise urllib.error.URLError('[Errno -3] Temporary failure in name resolution')
    monkeypatch.setattr(torch.hub, 'download_url_to_file', no_network)
    return hub / 'checkpoints' / 'swin_t_demo.pth'


def test_url_offline_one_message_from_loader_and_precheck(offline_hub, tmp_path):
    tiny = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))
    model = SwinTransformer(tiny, init_cfg=dict(type='Pretrained', checkpoint=URL))
    with pytest.raises(CheckpointError) as error:
        model.init_weights()
    message = str(error.value)
    assert URL in message and f'put it at {offline_hub}' in message and 'https:/github' not in \
        message.replace(URL, '')
    cfg = Config(dict(model=dict(backbone=dict(type='mmvit_ext.SwinTransformer', arch=tiny,
                                               init_cfg=dict(type='Pretrained', checkpoint=URL)))))
    assert missing_pretrained(cfg) == [f'model.backbone.init_cfg.checkpoint: {message}']
    offline_hub.parent.mkdir(parents=True, exist_ok=True)  # the user puts the file there
    torch.save({'model': official_swin_state_dict(16, (1, 1, 1, 1), (1, 2, 2, 4))}, offline_hub)
    assert missing_pretrained(cfg) == []
    model.init_weights()
    assert model.load_report.layout.startswith('official Swin')


def test_other_schemes_are_named_not_mangled():
    with pytest.raises(CheckpointError, match=r'open-mmlab://swin_t: only local files and '
                                              r'http\(s\):// URLs'):
        read_checkpoint('open-mmlab://swin_t')


def test_url_is_downloaded_into_the_hub_cache(offline_hub, monkeypatch, tmp_path):
    served = tmp_path / 'served.pth'
    torch.save({'model': official_swin_state_dict(16, (1, 1, 1, 1), (1, 2, 2, 4))}, served)
    monkeypatch.setattr(torch.hub, 'download_url_to_file',
                        lambda url, dst, *a, **k: Path(dst).write_bytes(served.read_bytes()))
    assert 'layers.0.blocks.0.attn.qkv.weight' in read_checkpoint(URL)['model']
    assert offline_hub.is_file()


def test_timm_training_checkpoint_loads_and_crafted_ones_stay_refused(tmp_path):
    from timm.models.swin_transformer import SwinTransformer as TimmSwin
    from timm.utils import CheckpointSaver, ModelEmaV3
    timm_model = TimmSwin(img_size=64, window_size=2, embed_dim=16, depths=(1, 1, 1, 1),
                          num_heads=(1, 2, 2, 4), num_classes=10)
    args = argparse.Namespace(model='swin_tiny_patch4_window7_224', lr=1e-3, epochs=300,
                              mean=None, amp=True, data_dir='/data/imagenet', sched='cosine')
    saver = CheckpointSaver(timm_model, torch.optim.AdamW(timm_model.parameters()), args=args,
                            model_ema=ModelEmaV3(timm_model), checkpoint_dir=str(tmp_path),
                            recovery_dir=str(tmp_path))
    saver.save_checkpoint(epoch=3, metric=81.2)
    if torch_compat.supports('training-state checkpoints'):
        checkpoint = read_checkpoint(tmp_path / 'last.pth.tar')  # weights only
        assert checkpoint['args'].lr == 1e-3 and checkpoint['version'] == 2
        assert checkpoint['metric'] == 81.2 and 'state_dict_ema' in checkpoint
        model = SwinTransformer(dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
                                window_size=2, init_cfg=dict(
                                    type='Pretrained', checkpoint=str(tmp_path / 'last.pth.tar')))
        model.init_weights()
        assert model.load_report.layout.startswith('timm Swin')
        assert not model.load_report.unexpected
    else:  # torch < 2.4 has no allowlist: refused in one line naming the torch it needs
        with pytest.raises(CheckpointError, match=r'refused .*needs torch >= 2\.4.*this is torch'):
            read_checkpoint(tmp_path / 'last.pth.tar')

    class Exploit:
        def __reduce__(self):
            return (subprocess.call, (['touch', str(tmp_path / 'pwned')],))
    torch.save({'state_dict': timm_model.state_dict(), 'args': argparse.Namespace(x=Exploit())},
               tmp_path / 'evil.pth.tar')
    with pytest.raises(CheckpointError, match='refused to load'):
        read_checkpoint(tmp_path / 'evil.pth.tar')
    assert not (tmp_path / 'pwned').exists()


def _tool(*args):
    return tool_process(ROOT / 'tools/convert_checkpoint.py', *args)


def test_convert_tool_names_the_layout_and_checks_the_output_loads(tmp_path):
    from timm.models.swin_transformer import SwinTransformer as TimmSwin
    timm_model = TimmSwin(img_size=64, window_size=2, embed_dim=16, depths=(1, 1, 2, 1),
                          num_heads=(1, 2, 2, 4), num_classes=10)
    src = tmp_path / 'timm_swin.pth'
    torch.save(timm_model.state_dict(), src)
    result = _tool(src, tmp_path / 'ours.safetensors')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'detected layout: timm Swin' in result.stdout
    assert 'load-checked' in result.stdout and 'SwinTransformer' in result.stdout
    result = _tool(tmp_path / 'ours.safetensors', tmp_path / 'again.pth')
    assert 'detected layout: mmvit_ext Swin (already ours' in result.stdout, result.stderr[-2000:]


def test_classifier_weights_into_dense_models_keep_the_pyramid_initialised():
    from timm.models.cait import Cait
    from mmvit_ext.backbones import CaiT
    timm_cait = Cait(img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2,
                     depth_token_only=2, num_classes=10)
    dense = CaiT(dict(embed_dims=32, depth=2, num_heads=2), img_size=64)  # pyramid, windows
    dense.load_state_dict(timm_cait.state_dict())  # strict=True
    report = dense.load_report
    assert report.expected_missing
    assert all(k.startswith('pyramid.') for k in report.expected_missing)
    assert report.missing == report.expected_missing and not report.unexpected
    assert 'cls_token' in report.dropped
    assert any(k.startswith('cls_blocks.') for k in report.dropped)


def test_hf_classification_wrappers_convert_like_the_bare_models():
    import transformers
    from mmvit_ext.converters import convert_hf_pvtv2, convert_hf_swin
    for config, bare, wrapped, convert in (
            (transformers.SwinConfig(image_size=32, embed_dim=8, depths=[1, 1], num_heads=[1, 2],
                                     window_size=2, num_labels=3),
             transformers.SwinModel, transformers.SwinForImageClassification, convert_hf_swin),
            (transformers.PvtV2Config(hidden_sizes=[8, 16], depths=[1, 1],
                                      num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                                      sr_ratios=[2, 1], num_encoder_blocks=2, num_labels=3),
             transformers.PvtV2Model, transformers.PvtV2ForImageClassification, convert_hf_pvtv2)):
        ours_from_bare = convert(bare(config).state_dict())
        ours_from_wrapped = convert(wrapped(config).state_dict())
        assert set(ours_from_wrapped) == set(ours_from_bare), bare.__name__
        assert not any(k.startswith(('classifier', 'swin.', 'pvt_v2.', 'embeddings.', 'encoder.'))
                       for k in ours_from_wrapped)


def test_precheck_reads_init_cfg_without_type_and_pretrained(tmp_path):
    """tools/train.py's pre-check sees the peers' other forms: init_cfg without ``type``
    (mmdet's PVT configs) and a backbone ``pretrained=PATH``."""
    absent = str(tmp_path / 'absent.pth')
    for backbone, where in [(dict(init_cfg=dict(checkpoint=absent)), 'init_cfg.checkpoint'),
                            (dict(pretrained=absent), 'pretrained')]:
        cfg = Config(dict(model=dict(backbone=dict(type='mmvit_ext.PyramidVisionTransformerV2',
                                                   **backbone))))
        problems = missing_pretrained(cfg)
        assert len(problems) == 1 and problems[0].startswith(f'model.backbone.{where}: ')
        assert absent in problems[0]
