"""Presets every registered backbone is tested with: the contract suite runs over all of them,
and a registered backbone without an entry here fails the suite."""
from typing import Dict, List

# A tiny custom arch per family keeps gradient tests fast; presets check the real shapes.
CASES: Dict[str, List[dict]] = {
    'SwinTransformer': [
        dict(arch='tiny'),
        dict(arch='base', window_size=12, pretrain_img_size=384),
        dict(arch='l', window_size=12, pretrain_img_size=384, use_abs_pos_embed=True),
        dict(arch=dict(embed_dims=32, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8)), window_size=4),
    ],
    'PyramidVisionTransformerV2': [
        dict(arch='b2'),
        dict(arch='b2_li'),
        dict(arch='b0'),
        dict(arch=dict(embed_dims=(16, 32, 40, 64), depths=(1, 2, 1, 1), num_heads=(1, 2, 5, 8))),
    ],
}

# The smallest case of each family, for gradient / checkpoint / freezing tests.
SMALL = {name: cases[-1] for name, cases in CASES.items()}
# Presets too heavy for the 513x769 size on a 2-core CPU are marked here.
LARGE_SIZE_OK = {('SwinTransformer', 0), ('SwinTransformer', 3), ('PyramidVisionTransformerV2', 1),
                 ('PyramidVisionTransformerV2', 2), ('PyramidVisionTransformerV2', 3)}
