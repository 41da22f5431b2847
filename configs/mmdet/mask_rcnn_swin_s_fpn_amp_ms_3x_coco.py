# Mask R-CNN + FPN, Swin-S, COCO 3x multi-scale with mixed precision (as mmdet ships).
_base_ = './mask_rcnn_swin_s_fpn_ms_3x_coco.py'

optim_wrapper = dict(type='AmpOptimWrapper')
