"""Our registry scope, ``mmvit_ext``: children of mmengine's root registries.

mmdet, mmseg and mmpretrain registries are children of the same roots, so a config in any of them
reaches our classes with a scoped type, ``type='mmvit_ext.SwinTransformer'``; mmengine imports
``mmvit_ext.registry`` by itself when it meets that scope, and ``locations`` registers the
backbones on first use. ``custom_imports=dict(imports=['mmvit_ext'])`` is the documented way; a
run through the peers' own tools that resumes mmengine training state adds
``mmvit_ext.TrustedCheckpointHook`` (docs/checkpoints.md). Downstream ``SwinTransformer`` registrations are
untouched: ours live only in this scope.
"""
from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import PARAM_SCHEDULERS as MMENGINE_PARAM_SCHEDULERS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmvit_ext',
                  locations=['mmvit_ext.backbones', 'mmvit_ext.models'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmvit_ext', locations=['mmvit_ext.engine'])
FUNCTIONS = Registry('function', parent=MMENGINE_FUNCTIONS, scope='mmvit_ext',
                     locations=['mmvit_ext.engine'])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    'optimizer wrapper constructor', parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
    scope='mmvit_ext', locations=['mmvit_ext.optim'])
OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmvit_ext',
                          locations=['mmvit_ext.engine'])
PARAM_SCHEDULERS = Registry('parameter scheduler', parent=MMENGINE_PARAM_SCHEDULERS,
                            scope='mmvit_ext', locations=['mmvit_ext.engine'])

__all__ = ['MODELS', 'HOOKS', 'FUNCTIONS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'OPTIM_WRAPPERS',
           'PARAM_SCHEDULERS']
