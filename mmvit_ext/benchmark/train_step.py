"""A detector's training step as a module of its input, for timing whole models."""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn


class DetectorTrainStep(nn.Module):
    """``forward(x)`` runs the detector's loss-mode forward on synthetic annotated images of
    ``x``'s shape, on ``x``'s device (images, boxes and masks alike), and returns the total
    loss. The samples are made once per (shape, device) and reused. mmcv's RoI / NMS ops get
    float32 (:func:`~mmvit_ext.engine.keep_ops_float32`), so the whole step may run under
    bf16 / fp16 autocast, as ``AmpOptimWrapper`` runs it."""

    def __init__(self, detector: nn.Module, num_items: int = 4, num_classes: int = 5) -> None:
        super().__init__()
        from ..engine.precision import keep_ops_float32
        keep_ops_float32(detector)
        self.detector = detector
        self.num_items, self.num_classes = num_items, num_classes
        self._key: Optional[Tuple] = None
        self._data: Optional[dict] = None

    def data_for(self, x: torch.Tensor) -> dict:
        """Preprocessed inputs and data samples matching ``x`` (B, 3, H, W) on its device."""
        key = (tuple(x.shape), x.device)
        if key != self._key:
            from mmdet.testing import demo_mm_inputs
            batch, _, height, width = x.shape
            packed = demo_mm_inputs(batch, [[3, height, width]] * batch,
                                    num_items=[self.num_items] * batch,
                                    num_classes=self.num_classes, with_mask=True)
            preprocessor = self.detector.data_preprocessor
            # mmengine's preprocessor casts images and samples to the device its own ``to()``
            # recorded, which a parent module's ``to()`` does not update
            preprocessor.to(x.device)
            self._data = preprocessor(packed, True)
            self._key = key
        return self._data

    def forward(self, x: torch.Tensor):
        data = self.data_for(x)
        losses = self.detector(data['inputs'], data['data_samples'], mode='loss')
        return [self.detector.parse_losses(losses)[0].reshape(1)]


class SegmentorStep(nn.Module):
    """An mmseg segmentor as a module of its input: in training mode ``forward(x)`` runs the
    loss-mode forward on a synthetic label map of ``x``'s size and returns the total loss; in
    eval mode it runs the segmentor's whole inference (``predict``: its ``test_cfg``
    windows / slides and the head's post-processing) and returns the per-pixel logits.
    ``x`` is taken as already normalised (the data preprocessor is not timed)."""

    def __init__(self, segmentor: nn.Module, num_regions: int = 4) -> None:
        super().__init__()
        self.segmentor = segmentor
        self.num_regions = num_regions
        self._key: Optional[Tuple] = None
        self._samples: Optional[list] = None

    def samples_for(self, x: torch.Tensor) -> list:
        """One ``SegDataSample`` per image: metainfo of ``x``'s size and a label map of
        ``num_regions`` vertical bands of different classes."""
        key = (tuple(x.shape), x.device)
        if key != self._key:
            from mmengine.structures import PixelData
            from mmseg.structures import SegDataSample
            batch, _, height, width = x.shape
            num_classes = self.segmentor.decode_head.num_classes
            bands = torch.arange(width, device=x.device) * self.num_regions // width
            self._samples = []
            for i in range(batch):
                labels = ((bands + i) % num_classes).expand(height, width)[None]
                sample = SegDataSample(metainfo=dict(
                    img_shape=(height, width), ori_shape=(height, width),
                    pad_shape=(height, width), padding_size=[0, 0, 0, 0], flip=False))
                sample.gt_sem_seg = PixelData(data=labels.long())
                self._samples.append(sample)
            self._key = key
        return self._samples

    def forward(self, x: torch.Tensor):
        samples = self.samples_for(x)
        if not self.training:
            return [torch.stack([s.seg_logits.data for s in self.segmentor.predict(x, samples)])]
        losses = self.segmentor(x, samples, mode='loss')
        return [self.segmentor.parse_losses(losses)[0].reshape(1)]


def whole_model_step(model: nn.Module) -> nn.Module:
    """A whole model as a module of its input: :class:`SegmentorStep` for an mmseg segmentor,
    else :class:`DetectorTrainStep`."""
    try:
        from mmseg.models.segmentors import BaseSegmentor
    except ImportError:
        BaseSegmentor = ()
    return SegmentorStep(model) if isinstance(model, BaseSegmentor) else DetectorTrainStep(model)


def apply_trained_state(model: nn.Module, custom_hooks: Sequence[dict]) -> List[str]:
    """Put a freshly built model in the state its training leaves it in: each of the config's
    ``custom_hooks`` that defines ``trained_state(model)`` applies it (EoMT's mask annealing:
    every probability 0). Returns the hooks applied."""
    from mmengine.registry import HOOKS
    applied = []
    for cfg in custom_hooks:
        hook = HOOKS.build(dict(cfg))
        if hasattr(hook, 'trained_state'):
            hook.trained_state(model)
            applied.append(type(hook).__name__)
    return applied
