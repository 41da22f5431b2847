"""A detector's training step as a module of its input, for timing whole models."""
from typing import Optional, Tuple

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
