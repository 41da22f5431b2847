"""Official ViT-Adapter checkpoints (czczup/ViT-Adapter: detection and segmentation releases,
and its DINOv2 adapter configs) -> our :class:`~mmvit_ext.backbones.ViTAdapter` layout.

The adapter parts keep the official names (``spm.*``, ``level_embed``,
``interactions.{i}.injector / extractor / extra_extractors.*``, ``up``, ``norm1..4``). What
differs: the trunk's LayerScale ``blocks.{i}.gamma1 / gamma2`` (ours ``ls1 / ls2.gamma``) and the
ConvFFN's ``ffn.dwconv.dwconv`` wrapper (ours ``ffn.dwconv``), and ``level_embed`` (ours
``spm.level_encoding``, so that parameters come in forward order). A trunk checkpoint of any
plain-ViT layout (DeiT, MAE, DINOv2 ...) loads too (:class:`ViTAdapter` lists the ``'vit'``
layouts); the adapter parts then keep their initialisation, as in the paper's fine-tuning.
"""
from .layouts import StateDict, has_key, register_init_only, register_layout, rename_keys

_ADAPTER = r'^(interactions\.\d+\.(injector|extractor)\.|spm\.stem\.0\.weight$)'
_OFFICIAL = (
    (r'^(blocks\.\d+)\.gamma1$', r'\1.ls1.gamma'),
    (r'^(blocks\.\d+)\.gamma2$', r'\1.ls2.gamma'),
    (r'\.ffn\.dwconv\.dwconv\.', '.ffn.dwconv.'),
    (r'^level_embed$', 'spm.level_encoding'),
)
_HEADS = ('head.', 'fc_norm.', 'mask_token')


def is_official_vit_adapter(state_dict: StateDict) -> bool:
    """Adapter keys with the official trunk LayerScale or ConvFFN wrapper names."""
    return has_key(state_dict, _ADAPTER) and (
        has_key(state_dict, r'^blocks\.\d+\.gamma[12]$')
        or has_key(state_dict, r'\.ffn\.dwconv\.dwconv\.') or 'level_embed' in state_dict)


def convert_official_vit_adapter(state_dict: StateDict) -> StateDict:
    """``blocks.{i}.gamma1/2`` -> ``blocks.{i}.ls1/2.gamma``; ``ffn.dwconv.dwconv`` ->
    ``ffn.dwconv``; classifier leftovers dropped. Others (ours) come back unchanged."""
    if not is_official_vit_adapter(state_dict):
        return dict(state_dict)
    return rename_keys(state_dict, _OFFICIAL, drop=lambda k: k.startswith(_HEADS))


def export_official_vit_adapter(state_dict: StateDict) -> StateDict:
    """Inverse of :func:`convert_official_vit_adapter`."""
    return rename_keys(state_dict, ((r'^(blocks\.\d+)\.ls1\.gamma$', r'\1.gamma1'),
                                    (r'^(blocks\.\d+)\.ls2\.gamma$', r'\1.gamma2'),
                                    (r'\.ffn\.dwconv\.', '.ffn.dwconv.dwconv.'),
                                    (r'^spm\.level_encoding$', 'level_embed')))


register_layout('official ViT-Adapter (czczup/ViT-Adapter detection / segmentation)',
                'vit_adapter', _ADAPTER, convert_official_vit_adapter,
                detect=is_official_vit_adapter)
register_layout('mmvit_ext ViT-Adapter', 'vit_adapter', _ADAPTER, ours=True,
                detect=lambda sd: not is_official_vit_adapter(sd))
# a plain-ViT trunk checkpoint has none of the adapter, nor LayerScale for DeiT / MAE trunks;
# an adapter checkpoint must be complete
register_init_only('vit_adapter', r'^(spm\.|interactions\.|up\.|norm[1-4]\.|'
                                  r'blocks\.\d+\.ls[12]\.gamma$)', layout_family='vit')
