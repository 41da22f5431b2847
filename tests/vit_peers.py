"""Peer implementations of every plain-ViT layout we load, built from the venv with random
weights (timm, transformers, mmpretrain, mmseg), as :mod:`layout_peers` does for the other
families. Official DINOv2 / MAE files are made from the timm model by the inverse of timm's own
converter (``_convert_dinov2``; MAE's encoder keys are timm's), plus what the files add
(``mask_token``, the MAE decoder)."""
import re
from typing import Dict

import torch
from torch import nn

from layout_peers import Case, build_in_scope, hf_checkpoint, randomise

DIM, DEPTH, HEADS = 32, 3, 2
IMG, PATCH, DINO_PATCH = 64, 16, 14
DINO_IMG = 56  # a 4 x 4 grid of 14 px patches


def ours(**extra) -> dict:
    cfg = dict(type='VisionTransformer', arch=dict(embed_dims=DIM, depth=DEPTH, num_heads=HEADS),
               img_size=IMG, drop_path_rate=0.0, window_size=None, simple_pyramid=False,
               with_cls_token=True, out_indices=(0, 1, 2))
    cfg.update(extra)
    return cfg


def dino_ours(**arch) -> dict:
    return ours(arch=dict(embed_dims=DIM, depth=DEPTH, num_heads=HEADS, patch_size=DINO_PATCH,
                          layer_scale=1e-5, **arch), img_size=DINO_IMG)


def _timm_features(model: nn.Module, norm_last: bool = True):
    """Patch tokens of every block as maps; the last through the final norm."""
    def run(x):
        maps = model.forward_intermediates(x, norm=False, intermediates_only=True)
        if norm_last:
            tokens = model.forward_features(x)[:, model.num_prefix_tokens:]
            maps[-1] = tokens.transpose(1, 2).reshape(maps[-1].shape)
        return tuple(maps)
    return run


def timm_vit(seed: int = 0, **kwargs) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer
    args = dict(img_size=IMG, patch_size=PATCH, embed_dim=DIM, depth=DEPTH, num_heads=HEADS,
                num_classes=10)
    args.update(kwargs)
    return randomise(VisionTransformer(**args), seed=seed)


def timm_to_official_dinov2(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """timm's ``_convert_dinov2`` run backwards: ``reg_token`` -> ``register_tokens`` with the
    class token's position slot split back out, ``fc1 / fc2`` -> ``w12 / w3`` for SwiGLU, and
    the ``mask_token`` the hub files carry."""
    out = {}
    for key, value in state.items():
        if key.startswith('head.'):
            continue
        out[key] = value
    if 'reg_token' in out:
        out['register_tokens'] = out.pop('reg_token')
        cls_pos = 0.1 * torch.randn(1, 1, out['pos_embed'].shape[-1])
        out['cls_token'] = out['cls_token'] - cls_pos
        out['pos_embed'] = torch.cat([cls_pos, out['pos_embed']], dim=1)
    out['mask_token'] = torch.zeros(1, out['cls_token'].shape[-1])
    return out


def vit_cases() -> Dict[str, Case]:
    import transformers
    cases = {}
    deit = timm_vit(seed=0)
    cases['timm ViT / DeiT'] = Case('vit', 'timm ViT', deit.state_dict(), _timm_features(deit),
                                    ours(), IMG)
    mae = deit.state_dict()
    mae = {k: v for k, v in mae.items() if not k.startswith('head.')}
    cases['official MAE encoder (mae_pretrain_vit_*)'] = Case(
        'vit', 'mmvit_ext ViT', {'model': dict(mae)}, _timm_features(deit), ours(), IMG)
    with_decoder = dict(mae, mask_token=torch.zeros(1, 1, DIM),
                        **{'decoder_embed.weight': torch.zeros(16, DIM),
                           'decoder_blocks.0.norm1.weight': torch.ones(16)})
    cases['official MAE with decoder'] = Case('vit', 'official MAE', {'model': with_decoder},
                                              _timm_features(deit), ours(), IMG)

    dino_args = dict(img_size=DINO_IMG, patch_size=DINO_PATCH, init_values=1e-5)
    dino = timm_vit(seed=1, **dino_args)
    cases['timm DINOv2'] = Case('vit', 'timm ViT', dino.state_dict(), _timm_features(dino),
                                dino_ours(), DINO_IMG)
    cases['official DINOv2'] = Case('vit', 'official DINOv2',
                                    timm_to_official_dinov2(dino.state_dict()),
                                    _timm_features(dino), dino_ours(), DINO_IMG)
    dino_reg = timm_vit(seed=2, reg_tokens=4, no_embed_class=True, **dino_args)
    cases['timm DINOv2 + registers'] = Case('vit', 'timm ViT', dino_reg.state_dict(),
                                            _timm_features(dino_reg), dino_ours(reg_tokens=4),
                                            DINO_IMG)
    official_reg = timm_to_official_dinov2(dino_reg.state_dict())
    # the official file with registers: class token and its position slot apart
    cases['official DINOv2 + registers'] = Case('vit', 'official DINOv2', official_reg,
                                                _timm_features(dino_reg), dino_ours(reg_tokens=4),
                                                DINO_IMG)
    from timm.layers import SwiGLUPacked
    giant = timm_vit(seed=3, mlp_layer=SwiGLUPacked, act_layer=nn.SiLU,  # as timm's giant
                     mlp_ratio=5.5,  # DINOv2's hidden-width rounding at DIM
                      **dino_args)
    cases['timm DINOv2 SwiGLU (giant)'] = Case('vit', 'timm ViT', giant.state_dict(),
                                               _timm_features(giant), dino_ours(ffn='swiglu'),
                                               DINO_IMG)
    official_giant = {re.sub(r'\.mlp\.fc1\.', '.mlp.w12.', re.sub(r'\.mlp\.fc2\.', '.mlp.w3.', k)): v
                      for k, v in timm_to_official_dinov2(giant.state_dict()).items()}
    cases['official DINOv2 SwiGLU (giant)'] = Case('vit', 'official DINOv2', official_giant,
                                                   _timm_features(giant), dino_ours(ffn='swiglu'),
                                                   DINO_IMG)
    cases.update(hf_cases(transformers))
    cases.update(openmmlab_cases())
    cases.update(dinov3_cases())
    return cases


def dinov3_ours(cfg: dict) -> dict:
    """Our config for a reference DINOv3 ``cfg``: every block's normed patch map."""
    arch = dict(embed_dims=cfg['embed_dim'], depth=cfg['depth'], num_heads=cfg['num_heads'],
                mlp_ratio=cfg['ffn_ratio'], ffn=cfg['ffn_layer'], patch_size=16,
                layer_scale=1e-5, reg_tokens=cfg['n_storage_tokens'], norm_eps=1e-5,
                rope=dict(base=100.0), mask_k_bias=cfg['mask_k_bias'],
                qkv_bias=cfg['qkv_bias'], untie_norms=cfg['untie_cls_and_patch_norms'])
    return dict(type='VisionTransformer', arch=arch, out_indices=tuple(range(cfg['depth'])),
                simple_pyramid=False, out_norm=True, img_size=64, drop_path_rate=0.0)


def dinov3_cases() -> Dict[str, Case]:
    """DINOv3 in the official, timm and transformers layouts, against the test-side reference
    (tests/dinov3_reference.py: no DINOv3 needed in the installed timm / transformers)."""
    import dinov3_reference as ref
    cfg = dict(ref.TINY, ffn_layer='swiglu', ffn_ratio=6.0)
    official = ref.official_state_dict(cfg, seed=11)

    def features(x):
        return tuple(m for m, _ in ref.get_intermediate_layers(official, cfg, x,
                                                                range(cfg['depth'])))
    return {'official DINOv3': Case('vit', 'official DINOv3', official, features,
                                    dinov3_ours(cfg), 64),
            'timm DINOv3': Case('vit', 'timm DINOv3', ref.official_to_timm(official), features,
                                dinov3_ours(cfg), 64),
            'HF DINOv3ViTModel': Case('vit', 'Hugging Face transformers DINOv3',
                                      ref.official_to_hf(official), features, dinov3_ours(cfg),
                                      64)}


def _hf_features(model: nn.Module, final_norm: nn.Module, prefix: int = 1):
    def run(x):
        states = model(x, output_hidden_states=True).hidden_states[1:]
        states = (*states[:-1], final_norm(states[-1]))
        side = int(round((states[0].shape[1] - prefix) ** 0.5))
        return tuple(s[:, prefix:].transpose(1, 2).reshape(s.shape[0], DIM, side, side)
                     for s in states)
    return run


def hf_cases(transformers) -> Dict[str, Case]:
    cases = {}
    config = transformers.ViTConfig(hidden_size=DIM, num_hidden_layers=DEPTH,
                                    num_attention_heads=HEADS, intermediate_size=4 * DIM,
                                    image_size=IMG, patch_size=PATCH, layer_norm_eps=1e-6,
                                    hidden_act='gelu')
    model = randomise(transformers.ViTModel(config), seed=4)
    cases['HF ViTModel'] = Case('vit', 'Hugging Face transformers ViT', hf_checkpoint(model),
                                _hf_features(model, model.layernorm), ours(), IMG)
    classifier = randomise(transformers.ViTForImageClassification(config), seed=5)
    cases['HF ViTForImageClassification'] = Case(
        'vit', 'Hugging Face transformers ViT', hf_checkpoint(classifier),
        _hf_features(classifier.vit, classifier.vit.layernorm), ours(), IMG)
    dconfig = transformers.Dinov2Config(hidden_size=DIM, num_hidden_layers=DEPTH,
                                        num_attention_heads=HEADS, mlp_ratio=4,
                                        image_size=DINO_IMG, patch_size=DINO_PATCH,
                                        layerscale_value=1e-5,
                                        out_features=['stage1', 'stage2', 'stage3'],
                                        apply_layernorm=False, reshape_hidden_states=True)
    dmodel = randomise(transformers.Dinov2Model(dconfig), seed=6)
    cases['HF Dinov2Model'] = Case('vit', 'Hugging Face transformers DINOv2', hf_checkpoint(dmodel),
                                   _hf_features(dmodel, dmodel.layernorm), dino_ours(), DINO_IMG)
    dbackbone = randomise(transformers.Dinov2Backbone(dconfig), seed=7)

    def backbone_features(x):
        maps = list(dbackbone(x).feature_maps)
        last = maps[-1]
        maps[-1] = dbackbone.layernorm(last.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(
            last.shape)
        return tuple(maps)
    cases['HF Dinov2Backbone'] = Case('vit', 'Hugging Face transformers DINOv2',
                                      hf_checkpoint(dbackbone), backbone_features, dino_ours(),
                                      DINO_IMG)
    swiglu = transformers.Dinov2Config(**{**dconfig.to_dict(), 'use_swiglu_ffn': True})
    dclassifier = randomise(transformers.Dinov2ForImageClassification(swiglu), seed=8)
    cases['HF Dinov2ForImageClassification (SwiGLU)'] = Case(
        'vit', 'Hugging Face transformers DINOv2', hf_checkpoint(dclassifier),
        _hf_features(dclassifier.dinov2, dclassifier.dinov2.layernorm),
        dino_ours(ffn='swiglu'), DINO_IMG)
    return cases


def _mm_features(backbone: nn.Module):
    return lambda x: tuple(backbone(x))


def openmmlab_cases() -> Dict[str, Case]:
    cases = {}
    norm = dict(type='LN', eps=1e-6)
    arch = dict(embed_dims=DIM, num_layers=DEPTH, num_heads=HEADS, feedforward_channels=4 * DIM)
    classifier = randomise(build_in_scope('mmpretrain', dict(
        type='ImageClassifier',
        backbone=dict(type='VisionTransformer', arch=arch, img_size=IMG, patch_size=PATCH,
                      out_indices=(0, 1, 2), out_type='featmap', norm_cfg=norm),
        neck=None, head=dict(type='VisionTransformerClsHead', num_classes=10, in_channels=DIM))),
        seed=9)
    cases['mmpretrain ViT classifier'] = Case(
        'vit', 'OpenMMLab ViT', {'state_dict': classifier.state_dict(), 'meta': {}},
        _mm_features(classifier.backbone), ours(), IMG)
    dino = build_in_scope('mmpretrain', dict(
        type='VisionTransformer', arch=arch, img_size=DINO_IMG, patch_size=DINO_PATCH,
        out_indices=(0, 1, 2), out_type='featmap', norm_cfg=norm, layer_scale_init_value=1e-5,
        layer_cfgs=dict(ffn_type='swiglu_fused')))
    randomise(dino, seed=10)  # its train() returns None
    cases['mmpretrain DINOv2 SwiGLU'] = Case('vit', 'OpenMMLab ViT', dino.state_dict(),
                                             _mm_features(dino), dino_ours(ffn='swiglu'),
                                             DINO_IMG)
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    seg = MMSegViT(img_size=IMG, patch_size=PATCH, embed_dims=DIM, num_layers=DEPTH,
                   num_heads=HEADS, out_indices=(0, 1, 2), final_norm=True, with_cls_token=True,
                   norm_cfg=norm)  # mmseg's default patch_bias=False
    randomise(seg, seed=11)  # its train() returns None
    as_segmentor = {'backbone.' + k: v for k, v in seg.state_dict().items()}
    as_segmentor['decode_head.conv_seg.weight'] = torch.zeros(5, DIM, 1, 1)
    cases['mmseg ViT segmentor'] = Case('vit', 'OpenMMLab ViT',
                                        {'state_dict': as_segmentor, 'meta': {}},
                                        _mm_features(seg), ours(patch_bias=False), IMG)
    return cases
