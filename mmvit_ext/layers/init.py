"""Weight initialisation shared by the families (the official models' ViT scheme)."""
from torch import nn


def init_linear_and_norm(module: nn.Module) -> None:
    """Linear: truncated normal (std 0.02), zero bias; LayerNorm: ones / zeros. Use with
    ``model.apply``."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
