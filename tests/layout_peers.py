"""Peer implementations of every layout we load, built from the venv with random weights.

Each case gives the checkpoint exactly as a user holds it (timm ``model.state_dict()``, a
transformers model's saved weights, a whole mmdet detector checkpoint...), the peer's own features
for an input, and our config for the same architecture. Outputs are compared like with like:
where the peer has no output norm for a stage (a classifier keeps only the final one) the peer's
map goes through a plain LayerNorm, which is what our freshly initialised output norm is.
"""
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

Features = Callable[[torch.Tensor], Tuple[torch.Tensor, ...]]

SWIN = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
SWIN_WINDOW, SWIN_IMG = 2, 128  # every stage larger than a window: no peer clamps or pads
PVT = dict(embed_dims=(16, 32, 64, 128), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8),
           mlp_ratios=(8, 8, 4, 4), sr_ratios=(8, 4, 2, 1))
PVT_IMG = 64
CAIT = dict(embed_dims=32, depth=2, num_heads=2, layer_scale=1e-5, cls_depth=2)
CAIT_IMG = 64


@dataclass
class Case:
    family: str
    layout: str           # what detection must name
    checkpoint: object    # as the user holds it: a state dict or a training checkpoint
    features: Features    # the peer's own forward
    ours: dict            # our backbone config
    image: int


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere (norm gains around 1), so no branch hides behind an init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if re.search(r'(norm|layernorm|layer_norm)[^.]*\.weight$|\.ln\d?\.weight$', name):
                param.copy_(1 + 0.1 * noise)
            elif 'relative_position_bias_table' in name:
                param.copy_(0.5 * noise)
            else:
                param.copy_(0.05 * noise)
    return model.eval()


def hf_checkpoint(model: nn.Module) -> Dict[str, torch.Tensor]:
    """A transformers model's weights as its files hold them (``save_pretrained``, the Hub's
    layout): transformers 5 renames some models' modules in memory (ViT's ``attention.q_proj``
    for ``attention.attention.query``) and names them back when it saves."""
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return load_file(str(Path(folder) / 'model.safetensors'))


def set_eps(model: nn.Module, pattern: str, eps: float) -> nn.Module:
    """Give the peer's LayerNorms matching ``pattern`` the official eps (mmdet / mmseg / HF use
    1e-6 where the official PVTv2 uses 1e-5): the comparison then tests only the weights."""
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) and re.search(pattern, name):
            module.eps = eps
    return model


def _ln(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Plain LayerNorm over the channels of an NCHW map (our fresh output norm)."""
    return F.layer_norm(x.permute(0, 2, 3, 1), x.shape[1:2], eps=eps).permute(0, 3, 1, 2)


def _swin_ours(**extra) -> dict:
    return dict(type='SwinTransformer', arch=dict(SWIN), window_size=SWIN_WINDOW,
                pretrain_img_size=SWIN_IMG, drop_path_rate=0.0, **extra)


# ---- Swin ------------------------------------------------------------------------------------
def timm_swin() -> nn.Module:
    from timm.models.swin_transformer import SwinTransformer
    return randomise(SwinTransformer(img_size=SWIN_IMG, window_size=SWIN_WINDOW,
                                     embed_dim=SWIN['embed_dims'], depths=SWIN['depths'],
                                     num_heads=SWIN['num_heads'], num_classes=10))


def _timm_swin_features(model: nn.Module) -> Features:
    def run(x):
        maps = model.forward_intermediates(x, norm=False, intermediates_only=True)
        last = model.forward_features(x).permute(0, 3, 1, 2)
        return (*(_ln(m) for m in maps[:-1]), last)
    return run


def timm_swin_to_official(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """timm's own converter run backwards (the test checks it forwards): patch merging back to
    the end of the previous stage, ``head.fc`` -> ``head``, saved index buffers added."""
    from official_layouts import official_swin_rel_index
    out = {}
    for key, value in state.items():
        key = re.sub(r'^layers\.(\d+)\.downsample', lambda m: f'layers.{int(m.group(1)) - 1}'
                     f'.downsample', key).replace('head.fc.', 'head.')
        out[key] = value
        if key.endswith('attn.relative_position_bias_table'):
            out[key.replace('bias_table', 'index')] = official_swin_rel_index(SWIN_WINDOW)
    return out


def swin_cases() -> Dict[str, Case]:
    import transformers
    cases = {}
    peer = timm_swin()
    feats = _timm_swin_features(peer)
    cases['timm'] = Case('swin', 'timm Swin', peer.state_dict(), feats, _swin_ours(), SWIN_IMG)
    cases['official'] = Case('swin', 'official Swin',
                             {'model': timm_swin_to_official(peer.state_dict())}, feats,
                             _swin_ours(), SWIN_IMG)
    config = transformers.SwinConfig(image_size=SWIN_IMG, embed_dim=SWIN['embed_dims'],
                                     depths=list(SWIN['depths']), num_heads=list(SWIN['num_heads']),
                                     window_size=SWIN_WINDOW, layer_norm_eps=1e-5,
                                     out_features=['stage1', 'stage2', 'stage3', 'stage4'])
    hf_model = randomise(transformers.SwinModel(config), seed=1)

    def hf_model_features(x):
        emb, dims = hf_model.embeddings(x)
        enc = hf_model.encoder(emb, dims, output_hidden_states=True,
                               output_hidden_states_before_downsampling=True)
        maps = enc.reshaped_hidden_states[1:]
        last = hf_model.layernorm(enc.last_hidden_state)
        return (*(_ln(m) for m in maps[:-1]),
                last.transpose(1, 2).reshape(maps[-1].shape))
    cases['HF SwinModel'] = Case('swin', 'Hugging Face transformers Swin', hf_checkpoint(hf_model),
                                 hf_model_features, _swin_ours(), SWIN_IMG)
    hf_backbone = randomise(transformers.SwinBackbone(config), seed=2)
    cases['HF SwinBackbone'] = Case('swin', 'Hugging Face transformers Swin',
                                    hf_checkpoint(hf_backbone),
                                    lambda x: hf_backbone(x).feature_maps, _swin_ours(), SWIN_IMG)
    classifier = randomise(build_in_scope('mmpretrain', dict(
        type='ImageClassifier',
        backbone=dict(type='SwinTransformer', arch=dict(SWIN), img_size=SWIN_IMG,
                      window_size=SWIN_WINDOW, out_indices=(0, 1, 2, 3), drop_path_rate=0.0),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=10, in_channels=256))), seed=3)
    cases['mmpretrain'] = Case('swin', 'OpenMMLab Swin',
                               {'state_dict': classifier.state_dict(), 'meta': {}},
                               classifier.backbone, _swin_ours(), SWIN_IMG)
    detector = mmdet_swin_detector(seed=4)
    cases['mmdet Mask R-CNN'] = Case('swin', 'OpenMMLab Swin',
                                     {'state_dict': detector.state_dict(), 'meta': {}},
                                     detector.backbone, _swin_ours(), SWIN_IMG)
    return cases


def mask_rcnn_cfg(backbone: dict) -> dict:
    """A small Mask R-CNN around ``backbone`` (FPN on 32/64/128/256 channels)."""
    from mmengine.config import Config
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    cfg = Config.fromfile(str(root / 'configs/mask_rcnn_swin_t_fpn_1x_coco.py')).model
    cfg.backbone = backbone
    cfg.neck.in_channels = [32, 64, 128, 256]
    cfg.neck.out_channels = 32
    cfg.rpn_head.in_channels = cfg.rpn_head.feat_channels = 32
    cfg.roi_head.bbox_roi_extractor.out_channels = 32
    cfg.roi_head.bbox_head.in_channels = 32
    cfg.roi_head.bbox_head.fc_out_channels = 64
    cfg.roi_head.mask_roi_extractor.out_channels = 32
    cfg.roi_head.mask_head.in_channels = cfg.roi_head.mask_head.conv_out_channels = 32
    return cfg


def build_in_scope(scope: str, cfg: dict) -> nn.Module:
    """Build ``cfg`` with ``scope``'s MODELS in ``scope`` as the default scope, as its tools do
    (not in a scope another test left behind)."""
    from mmvit_ext.utils import build_model
    return build_model(cfg, scope=scope)


def build_detector(cfg: dict) -> nn.Module:
    return build_in_scope('mmdet', cfg)


def mmdet_swin_detector(seed: int = 0) -> nn.Module:
    backbone = dict(type='mmdet.SwinTransformer', embed_dims=SWIN['embed_dims'],
                    depths=SWIN['depths'], num_heads=SWIN['num_heads'], window_size=SWIN_WINDOW,
                    drop_path_rate=0.0, out_indices=(0, 1, 2, 3), init_cfg=None)
    return randomise(build_detector(mask_rcnn_cfg(backbone)), seed=seed)


def our_swin_detector() -> nn.Module:
    backbone = _swin_ours()
    backbone['type'] = 'mmvit_ext.SwinTransformer'
    return build_detector(mask_rcnn_cfg(backbone)).eval()


# ---- PVTv2 -----------------------------------------------------------------------------------
def _pvt_ours(**arch) -> dict:
    return dict(type='PyramidVisionTransformerV2', arch=dict(PVT, **arch), drop_path_rate=0.0)


def timm_pvt_to_official(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """timm's own converter run backwards (the test checks it forwards)."""
    out = {}
    for key, value in state.items():
        key = re.sub(r'^patch_embed\.', 'patch_embed1.', key)
        key = re.sub(r'^stages\.(\d+)\.downsample\.',
                     lambda m: f'patch_embed{int(m.group(1)) + 1}.', key)
        key = re.sub(r'^stages\.(\d+)\.blocks\.', lambda m: f'block{int(m.group(1)) + 1}.', key)
        key = re.sub(r'^stages\.(\d+)\.norm\.', lambda m: f'norm{int(m.group(1)) + 1}.', key)
        out[key.replace('.mlp.dwconv.', '.mlp.dwconv.dwconv.')] = value
    return out


def pvt_cases() -> Dict[str, Case]:
    import transformers
    from timm.models.pvt_v2 import PyramidVisionTransformerV2 as TimmPVT
    cases = {}
    timm_model = randomise(TimmPVT(depths=PVT['depths'], embed_dims=PVT['embed_dims'],
                                   num_heads=PVT['num_heads'], mlp_ratios=PVT['mlp_ratios'],
                                   sr_ratios=PVT['sr_ratios'], num_classes=10))

    def timm_features(x):
        feats, x = [], timm_model.patch_embed(x)
        for stage in timm_model.stages:
            x = stage(x)
            feats.append(x)
        return tuple(feats)
    cases['timm'] = Case('pvtv2', 'timm PVTv2', timm_model.state_dict(), timm_features,
                         _pvt_ours(), PVT_IMG)
    cases['official'] = Case('pvtv2', 'official PVTv2',
                             timm_pvt_to_official(timm_model.state_dict()), timm_features,
                             _pvt_ours(), PVT_IMG)
    config = transformers.PvtV2Config(
        hidden_sizes=list(PVT['embed_dims']), depths=list(PVT['depths']),
        num_attention_heads=list(PVT['num_heads']), mlp_ratios=list(PVT['mlp_ratios']),
        sr_ratios=list(PVT['sr_ratios']), out_features=['stage1', 'stage2', 'stage3', 'stage4'])
    hf_norms = r'patch_embedding\.layer_norm$|attention\.layer_norm$'
    hf_model = set_eps(randomise(transformers.PvtV2Model(config), seed=1), hf_norms, 1e-5)
    cases['HF PvtV2Model'] = Case(
        'pvtv2', 'Hugging Face transformers PVTv2', hf_checkpoint(hf_model),
        lambda x: hf_model(x, output_hidden_states=True).hidden_states, _pvt_ours(), PVT_IMG)
    hf_backbone = set_eps(randomise(transformers.PvtV2Backbone(config), seed=2), hf_norms, 1e-5)
    cases['HF PvtV2Backbone'] = Case('pvtv2', 'Hugging Face transformers PVTv2',
                                     hf_checkpoint(hf_backbone),
                                     lambda x: hf_backbone(x).feature_maps, _pvt_ours(), PVT_IMG)
    from mmdet.models.backbones.pvt import PyramidVisionTransformerV2 as MMDetPVT
    mmdet = randomise(MMDetPVT(embed_dims=16, num_layers=list(PVT['depths']),
                               num_heads=list(PVT['num_heads']), mlp_ratios=PVT['mlp_ratios'],
                               sr_ratios=PVT['sr_ratios'], drop_path_rate=0.0), seed=3)
    mm_norms = r'^layers\.\d+\.0\.norm$|attn\.norm$'
    set_eps(mmdet, mm_norms, 1e-5)
    as_detector = {'backbone.' + k: v for k, v in mmdet.state_dict().items()}
    cases['mmdet'] = Case('pvtv2', 'mmdet PVTv2', {'state_dict': as_detector, 'meta': {}}, mmdet,
                          _pvt_ours(), PVT_IMG)
    from mmseg.models.backbones import MixVisionTransformer
    mit = randomise(MixVisionTransformer(embed_dims=16, num_layers=list(PVT['depths']),
                                         num_heads=list(PVT['num_heads']), mlp_ratio=4,
                                         sr_ratios=list(PVT['sr_ratios']), drop_path_rate=0.0),
                    seed=4)
    set_eps(mit, mm_norms, 1e-5)
    cases['mmseg MiT'] = Case('pvtv2', 'mmdet PVTv2 / mmseg MiT', mit.state_dict(), mit,
                              _pvt_ours(mlp_ratios=(4, 4, 4, 4)), PVT_IMG)
    return cases


# ---- CaiT ------------------------------------------------------------------------------------
def cait_cases() -> Dict[str, Case]:
    from timm.models.cait import Cait
    model = randomise(Cait(img_size=CAIT_IMG, patch_size=16, embed_dim=CAIT['embed_dims'],
                           depth=CAIT['depth'], num_heads=CAIT['num_heads'], init_values=1e-5,
                           depth_token_only=CAIT['cls_depth'], num_classes=10))
    ours = dict(type='CaiT', arch=dict(CAIT), img_size=CAIT_IMG, out_type='cls_token',
                drop_path_rate=0.0)
    return {'official / timm': Case('cait', 'official CaiT', model.state_dict(),
                                    lambda x: (model.forward_features(x)[:, 0],), ours, CAIT_IMG)}


# ---- DINOv3 ConvNeXt ---------------------------------------------------------------------------
def convnext_cases() -> Dict[str, Case]:
    """The official hub layout and transformers' DINOv3ConvNextModel layout against the
    test-side reference (tests/convnext_reference.py), the final norm on the last map."""
    import convnext_reference as ref
    official = ref.official_state_dict(**ref.TINY, seed=5)
    ours = dict(type='ConvNeXt', arch=dict(ref.TINY), out_norm=True)

    def features(x):
        return ref.intermediate_layers(official, x, norm=True)
    return {'official DINOv3 ConvNeXt': Case('convnext', 'official DINOv3 ConvNeXt', official,
                                             features, ours, 64),
            'HF DINOv3ConvNextModel': Case('convnext', 'Hugging Face transformers DINOv3 ConvNeXt',
                                           ref.official_to_hf(official), features, ours, 64)}


# ---- the DINOv3 adapter -----------------------------------------------------------------------
def dinov3_adapter_cases() -> Dict[str, Case]:
    """The official ``DINOv3_Adapter`` state dict (trunk under ``backbone.``) against the
    test-side reference (tests/dinov3_adapter_reference.py), built by its registered name."""
    import dinov3_reference as ref
    from dinov3_adapter_reference import DINOv3AdapterReference
    from test_vit_adapter_reference import _perturbed
    from vit_peers import dinov3_ours
    cfg, indexes = dict(ref.TINY, depth=4), [0, 1, 2, 3]
    adapter = dict(conv_inplane=8, n_points=4, deform_num_heads=2, deform_ratio=0.5)
    trunk = ref.official_state_dict(cfg, seed=12)
    reference = _perturbed(DINOv3AdapterReference(cfg['embed_dim'], indexes, **adapter), 13)
    ours = dict(type='DINOv3Adapter', arch=dinov3_ours(cfg)['arch'], interaction_indexes=indexes,
                drop_path_rate=0.0, **adapter)
    return {'official DINOv3_Adapter': Case(
        'dinov3_adapter', 'official DINOv3_Adapter', reference.official_state_dict(trunk),
        lambda x: tuple(reference(x, trunk, cfg)), ours, 64)}


def build_ours(cfg: dict, init_cfg: Optional[dict] = None) -> nn.Module:
    return build_in_scope('mmvit_ext', dict(cfg, init_cfg=init_cfg))


def official_round_trip_cases() -> Dict[str, Case]:
    """DeepViT / Refined-ViT: no implementation of the official layout in the venv (timm has
    neither), so our model with random weights is exported to it and must come back exactly."""
    from mmvit_ext.converters import (export_official_deepvit, export_official_refiner,
                                      export_official_vit_adapter)
    cases = {}
    classifier = dict(out_type='cls_token')
    for family, kind, arch, export, extra in (
            ('deepvit', 'DeepViT', dict(embed_dims=32, depth=4, num_heads=2, reattention_blocks=2,
                                        conv_stem=(8, 8)), export_official_deepvit, classifier),
            ('refiner', 'RefinedViT', dict(embed_dims=32, depth=4, num_heads=2,
                                           conv_stem=(8, 8, 16)), export_official_refiner,
             classifier),
            ('vit_adapter', 'ViTAdapter', dict(embed_dims=32, depth=4, num_heads=2),
             export_official_vit_adapter, dict(deform_num_heads=2, conv_inplane=8))):
        cfg = dict(type=kind, arch=arch, img_size=64, drop_path_rate=0.0, **extra)
        source = randomise(build_ours(cfg), seed=7)
        with torch.no_grad():  # BatchNorm statistics away from (0, 1)
            for name, buf in source.named_buffers():
                if name.endswith('running_var'):
                    buf.uniform_(0.5, 1.5)
                elif name.endswith('running_mean'):
                    buf.normal_(0, 0.1)
        cases[family] = Case(family, 'official', {'state_dict': export(source.state_dict())},
                             source, cfg, 64)
    return cases


def all_cases() -> Dict[Tuple[str, str], Case]:
    """(family, case name) -> case, over every builder above; the families come from the cases
    (test_layouts checks that every registered family with a foreign layout has one)."""
    torch.manual_seed(0)
    cases = {}
    import vit_peers  # imports this module: its cases are built here, not at import
    for build in (swin_cases, pvt_cases, cait_cases, vit_peers.vit_cases, convnext_cases,
                  dinov3_adapter_cases):
        cases.update({(case.family, name): case for name, case in build().items()})
    cases.update({(case.family, 'official (round trip, no peer in the venv)'): case
                  for case in official_round_trip_cases().values()})
    return cases


def upernet_cfg(backbone: dict) -> dict:
    """A small UperNet around ``backbone`` (decode head on 32/64/128/256 channels)."""
    from mmengine.config import Config
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    cfg = Config.fromfile(str(root / 'configs/upernet_swin_t_512x512_160k_ade20k.py')).model
    cfg.backbone = backbone
    cfg.decode_head.update(in_channels=[32, 64, 128, 256], channels=32, num_classes=5)
    cfg.auxiliary_head.update(in_channels=128, channels=16, num_classes=5)
    cfg.data_preprocessor.size = (SWIN_IMG, SWIN_IMG)
    return cfg


def build_segmentor(cfg: dict) -> nn.Module:
    return build_in_scope('mmseg', cfg)


def mmseg_swin_upernet(seed: int = 0) -> nn.Module:
    backbone = dict(type='mmseg.SwinTransformer', embed_dims=SWIN['embed_dims'],
                    depths=SWIN['depths'], num_heads=SWIN['num_heads'], window_size=SWIN_WINDOW,
                    drop_path_rate=0.0, out_indices=(0, 1, 2, 3), init_cfg=None)
    return randomise(build_segmentor(upernet_cfg(backbone)), seed=seed)


def our_swin_upernet() -> nn.Module:
    backbone = _swin_ours()
    backbone['type'] = 'mmvit_ext.SwinTransformer'
    return build_segmentor(upernet_cfg(backbone)).eval()
