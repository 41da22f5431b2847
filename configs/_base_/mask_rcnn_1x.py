# Mask R-CNN + FPN, COCO 1x, shared recipe; a child sets the backbone (`_delete_=True`) and
# `neck.in_channels`.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::_base_/datasets/coco_instance.py',
          './det_adamw_1x.py']
