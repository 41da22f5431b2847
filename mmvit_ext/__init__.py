"""mmvit_ext: ViT-family backbones registered into the OpenMMLab registry tree.

Importing the package registers every backbone in the ``mmvit_ext`` scope and changes nothing
in torch: mmengine's training checkpoints load under torch's ``weights_only`` loading where we
load them (``tools/*.py``, our reader, ``TrustedCheckpointHook``, or
``utils.safe_checkpoint.trusted_training_state()``; docs/checkpoints.md). Where onedl-mmpretrain
<= 1.3.6 sits beside transformers >= 5 it supplies the one helper mmpretrain imports and
transformers dropped (``utils/transformers_compat.py``), so import it before mmdet / mmpretrain.
"""
from .distributions import missing_runtime

_missing = missing_runtime()  # one line naming both distributions, before mmengine is needed
if _missing is not None:
    raise ImportError(_missing)

from .config_files import register_scope  # noqa: E402
from .utils.env_check import mend_breaks, warn_problems  # noqa: E402
from .utils.safe_checkpoint import allow_mmengine_checkpoints  # noqa: E402
from .version import __version__  # noqa: E402

mend_breaks()  # a helper the installed peers import and their transformers lacks, supplied
warn_problems()  # installed-package combinations that break the peers' imports, named first
register_scope()  # `_base_ = 'mmvit_ext::dir/file.py'` resolves to the shipped configs

from . import backbones, converters, engine, flags, layers, models  # noqa: E402,F401
from .optim import LayerDecayOptimWrapperConstructor  # noqa: E402
from .registry import HOOKS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS  # noqa: E402

__all__ = ['__version__', 'MODELS', 'HOOKS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'backbones', 'engine',
           'flags', 'converters', 'layers', 'LayerDecayOptimWrapperConstructor',
           'allow_mmengine_checkpoints']
