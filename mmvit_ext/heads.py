"""mmseg decode heads in the ``mmvit_ext`` scope. mmseg is needed here only: a config that uses a
head imports this module (``custom_imports = dict(imports=['mmvit_ext', 'mmvit_ext.heads'])``),
the backbones never do."""
import copy
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.logging import print_log
from mmseg.models.decode_heads import Mask2FormerHead
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.structures import SegDataSample

from . import flags
from .converters.io import CheckpointError, read_checkpoint, unwrap_state_dict
from .converters.loading import LoadReport, current_source, loading_source, prepare_state_dict
from .registry import MODELS


@MODELS.register_module()
class BNLinearHead(BaseDecodeHead):
    """The linear probe of DINOv2 / DINOv3 dense evaluation (``dinov3/eval/segmentation/
    models/heads/linear_head.py``): the selected maps resized to the first one's size and
    concatenated (``input_transform='resize_concat'``), then dropout, BatchNorm and one 1x1
    conv, in that order; no hidden layer.

    Args:
        in_channels: channels of each selected map; ``channels`` is their sum (it may be left
            out, a different value is refused).
        norm_cfg: the BatchNorm (the official head: ``SyncBatchNorm``).
    """

    def __init__(self, in_channels: Union[int, Sequence[int]], channels: int = 0,
                 norm_cfg: dict = dict(type='SyncBN', requires_grad=True), **kwargs) -> None:
        total = sum(in_channels) if isinstance(in_channels, (list, tuple)) else int(in_channels)
        if channels not in (0, total):
            raise ValueError(f'BNLinearHead: channels must be the summed in_channels ({total}) '
                             f'or left out, got {channels}')
        super().__init__(in_channels, total, norm_cfg=norm_cfg, **kwargs)
        self.bn = build_norm_layer(norm_cfg, total)[1]

    def forward(self, inputs: List[torch.Tensor]) -> torch.Tensor:
        """(B, sum C_i, H, W) logits at the first selected map's size."""
        feats = self._transform_inputs(inputs)
        if self.dropout is not None:
            feats = self.dropout(feats)
        return self.conv_seg(self.bn(feats))


def _widths(kwargs: dict, dims: int) -> dict:
    """mmseg ``Mask2FormerHead`` arguments with every width set from the hidden ``dims``."""
    kwargs = copy.deepcopy(kwargs)
    kwargs.update(feat_channels=dims, out_channels=dims)
    for layer in (kwargs['pixel_decoder']['encoder']['layer_cfg'],
                  kwargs['transformer_decoder']['layer_cfg']):
        for name, part in layer.items():
            part['embed_dims'] = dims
            if name == 'ffn_cfg':
                part['feedforward_channels'] = 2 * dims
    for encoding in (kwargs['pixel_decoder']['positional_encoding'],
                     kwargs['positional_encoding']):
        encoding['num_feats'] = dims // 2
    return kwargs


@MODELS.register_module()
class DINOv3Mask2FormerHead(Mask2FormerHead):
    """mmseg's ``Mask2FormerHead`` (mmdet's ``MSDeformAttnPixelDecoder`` and
    ``Mask2FormerTransformerDecoder``, unchanged), which computes the official DINOv3 m2f head
    (``dinov3/eval/segmentation/models/heads/mask2former_head.py``) when configured as
    configs/mmseg/mask2former_dinov3_* are (docs/model_zoo.md says why), plus what a user of the
    official segmentor needs:

    * its checkpoints on every load path: the official head (``pixel_decoder.*``,
      ``predictor.*``), the whole released file (``segmentation_model.1.*`` taken), or ours,
      detected and converted by a load-state-dict pre-hook (``load_state_dict``, mmengine's
      ``load_from``, ``init_cfg=dict(type='Pretrained', checkpoint=...)``), every head tensor
      required (``strict=False`` in the ``init_cfg`` allows partial loads);
    * the official ``predict`` resize in slide inference: each crop's masks to the crop's size
      (mmseg resizes them to the whole image's ``pad_shape``, which does not fit the crop).

    Takes mmseg's ``Mask2FormerHead`` arguments; ``hidden_dims`` sets every width of the head from
    one number (as the official ``hidden_dim``): channels and attention widths ``hidden_dims``,
    FFNs ``2 * hidden_dims`` (the official 4096 for 2048), sine features ``hidden_dims // 2``.
    """
    family = 'dinov3_m2f'
    layout_families = ('dinov3_m2f',)

    def __init__(self, hidden_dims: Optional[int] = None, **kwargs) -> None:
        super().__init__(**(kwargs if hidden_dims is None else _widths(kwargs, hidden_dims)))
        self.load_report: Optional[LoadReport] = None
        self._register_load_state_dict_pre_hook(self._convert_on_load)

    def init_weights(self) -> None:
        """mmdet's initialisation, then ``init_cfg`` checkpoints (``Pretrained``; ``prefix``
        optional: a whole mmseg checkpoint gives its ``decode_head.``)."""
        super().init_weights()
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]
        for cfg in (c for c in cfgs if isinstance(c, dict) and c.get('type') == 'Pretrained'):
            if 'checkpoint' not in cfg:
                raise ValueError(f'{type(self).__name__}: init_cfg of type Pretrained needs '
                                 f'checkpoint=PATH, got {cfg}')
            self.load_checkpoint(cfg['checkpoint'], prefix=cfg.get('prefix'),
                                 strict=cfg.get('strict', True))

    def load_checkpoint(self, path: str, prefix: Optional[str] = None,
                        strict: bool = True) -> LoadReport:
        """Load the head from a checkpoint of any known layout (see the class)."""
        source = f'checkpoint {path}'
        checkpoint = read_checkpoint(path, 'cpu')
        if prefix is None:  # an mmseg segmentor's head, else the whole file (official)
            try:
                state = unwrap_state_dict(checkpoint, source=source, prefix='decode_head.')
            except CheckpointError:
                state = unwrap_state_dict(checkpoint, source=source, prefix=None)
        else:
            state = unwrap_state_dict(checkpoint, source=source, prefix=prefix)
        with flags.strict_loading(bool(strict)), loading_source(source):
            self.load_state_dict(state, strict=True)
        return self.load_report

    def _convert_on_load(self, state_dict: Dict[str, torch.Tensor], prefix: str, *args) -> None:
        """Load-state-dict pre-hook: the keys under ``prefix`` converted from their layout and
        checked in place (:func:`~mmvit_ext.converters.loading.prepare_state_dict`)."""
        keys = [k for k in state_dict if k.startswith(prefix)]
        if not keys:
            return
        given = {k[len(prefix):]: state_dict.pop(k) for k in keys}
        converted, self.load_report = prepare_state_dict(self, given)
        state_dict.update((prefix + k, v) for k, v in converted.items())
        print_log(f'{type(self).__name__} ({prefix or "model"}): {current_source()}\n'
                  f'{self.load_report.summary()}', logger='current')

    def predict(self, x: Tuple[torch.Tensor], batch_img_metas: List[dict],
                test_cfg: dict) -> torch.Tensor:
        """(B, K, H, W) per-class scores at the input's size: softmax over the classes without
        the no-object column times sigmoid masks, summed over queries (the official semantic
        inference); the masks resized (bilinear) first to the crop in slide inference, else to
        the padded input."""
        all_cls_scores, all_mask_preds = self(x, [SegDataSample(metainfo=meta)
                                                  for meta in batch_img_metas])
        meta = batch_img_metas[0]
        slide = (test_cfg or {}).get('mode') == 'slide'
        size = meta['img_shape'] if slide or 'pad_shape' not in meta else meta['pad_shape']
        masks = F.interpolate(all_mask_preds[-1], size=tuple(size)[:2], mode='bilinear',
                              align_corners=False)
        scores = F.softmax(all_cls_scores[-1], dim=-1)[..., :-1]
        return torch.einsum('bqc,bqhw->bchw', scores, masks.sigmoid())


__all__ = ['BNLinearHead', 'DINOv3Mask2FormerHead']
