"""tools/train.py and tools/test.py: clear one-line failures before any work starts."""
from mmengine.config import Config

from mmvit_ext.utils.config_checks import missing_data, missing_pretrained, neck_channel_mismatch
from tool_runner import ROOT
from tool_runner import tool_process as _run


def test_headline_config_without_coco_fails_with_one_clear_line(tmp_path):
    result = _run(str(ROOT / 'tools/train.py'), str(ROOT / 'configs/mask_rcnn_pvtv2_b2.py'),
                  '--work-dir', str(tmp_path), cwd=tmp_path)
    assert result.returncode != 0
    assert 'Traceback' not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert len(lines) == 1 and "dataset root 'data/coco/' not found" in lines[0]
    assert 'checkpoints/pvt_v2_b2.pth' in lines[0]  # the missing weights are named too


def test_neck_channel_mismatch_names_the_numbers_to_use():
    cfg = Config.fromfile(str(ROOT / 'configs/mask_rcnn_pvtv2_b2.py'))
    assert neck_channel_mismatch(cfg) == []
    cfg.model.neck.in_channels = [96, 192, 384, 768]
    (problem,) = neck_channel_mismatch(cfg)
    assert 'model.neck.in_channels=[96, 192, 384, 768]' in problem
    assert 'use in_channels=[64, 128, 320, 512]' in problem


def test_missing_files_are_found_in_configs(tmp_path):
    cfg = Config.fromfile(str(ROOT / 'configs/mask_rcnn_swin_t_fpn_1x_coco.py'))
    (weights,) = missing_pretrained(cfg)
    assert "'checkpoints/swin_tiny_patch4_window7_224.pth'" in weights
    cfg.train_dataloader.dataset.data_root = str(tmp_path) + '/'
    problems = missing_data(cfg, ('train',))
    assert problems == [f"train_dataloader.dataset.ann_file: "
                        f"'{tmp_path}/annotations/instances_train2017.json' not found"]


def test_test_tool_names_a_missing_checkpoint(tmp_path):
    result = _run(str(ROOT / 'tools/test.py'), str(ROOT / 'configs/mask_rcnn_pvtv2_b2.py'),
                  str(tmp_path / 'nope.pth'))
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert f'file not found: {tmp_path / "nope.pth"}' in result.stderr


def test_every_tool_has_help_with_an_example():
    for tool in ('train.py', 'test.py', 'make_demo_data.py', 'summarize_demo.py'):
        result = _run(str(ROOT / 'tools' / tool), '--help')
        assert result.returncode == 0 and 'Example' in result.stdout, tool
