# Mask R-CNN + FPN, COCO 3x multi-scale, shared recipe; a child sets the backbone and neck.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './det_ms_3x.py']
