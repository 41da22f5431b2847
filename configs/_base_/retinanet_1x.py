# RetinaNet + FPN, COCO 1x, shared recipe; a child sets the backbone and neck.
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', 'mmdet::_base_/datasets/coco_detection.py',
          './det_adamw_1x.py']
