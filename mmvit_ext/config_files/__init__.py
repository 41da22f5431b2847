"""The configs that ship with the package, found from a checkout or an installed wheel.

A wheel carries ``configs/`` as ``mmvit_ext/.mim/configs`` (the layout mmdet / mmseg /
mmpretrain use), so ``_base_`` inheritance works from the installed location as it does in the
checkout. Three ways to use them:

* ``config_path('mask_rcnn_pvtv2_b2.py')``: the file's path, for ``tools/train.py`` or
  ``Config.fromfile``; from a shell, ``python -m mmvit_ext.config_files mask_rcnn_pvtv2_b2.py``
  prints it (no name: every config's relative name).
* ``_base_ = 'mmvit_ext::mmdet/mask_rcnn_pvtv2_b2_fpn_ms_3x_coco.py'`` in your own config, once
  ``mmvit_ext`` is imported before the config is read (``tools/train.py`` does;
  :func:`register_scope` adds ``mmvit_ext`` to the packages mmengine resolves ``::`` for).
  mmengine only resolves ``pkg::dir/file.py`` (a folder is required): the top-level configs are
  reached through :func:`config_path`.
"""
from pathlib import Path
from typing import List, Optional

PACKAGE_DIR = Path(__file__).resolve().parent.parent
INSTALLED = PACKAGE_DIR / '.mim' / 'configs'  # written by setup.py's build step
CHECKOUT = PACKAGE_DIR.parent / 'configs'     # editable install or PYTHONPATH checkout
PREFIX = 'mmvit_ext::'


def config_root() -> Path:
    """The folder holding the configs: the installed copy, else the checkout's ``configs/``."""
    for root in (INSTALLED, CHECKOUT):
        if (root / '_base_').is_dir():
            return root
    raise FileNotFoundError(f'mmvit_ext: no configs next to the package: neither {INSTALLED} '
                            f'(an installed wheel) nor {CHECKOUT} (a checkout)')


def list_configs(root: Optional[Path] = None) -> List[str]:
    """Relative names of the runnable configs (``_base_`` recipes left out), sorted."""
    root = config_root() if root is None else root
    return sorted(str(p.relative_to(root)) for p in root.rglob('*.py')
                  if '_base_' not in p.relative_to(root).parts)


def config_path(name: str) -> str:
    """Absolute path of the shipped config ``name`` (relative to ``configs/``; an
    ``mmvit_ext::`` prefix is accepted)."""
    relative = name[len(PREFIX):] if name.startswith(PREFIX) else name
    root = config_root()
    path = root / relative
    if not path.is_file():
        stem = Path(relative).stem
        close = [n for n in list_configs(root) if stem.split('_')[0] in n][:8]
        raise FileNotFoundError(f'mmvit_ext: no config {name!r} under {root}; '
                                f'some that exist: {close or list_configs(root)[:8]}')
    return str(path)


def register_scope() -> None:
    """Let mmengine resolve ``mmvit_ext::`` in ``_base_`` (it knows OpenMMLab's own packages
    by a table; a plugin adds itself), and ``mmseg::`` where the OneDL fork is installed: the
    table names OpenMMLab's distribution (``mmsegmentation``), which mmengine (onedl-mmengine
    0.10.12 too) then finds neither by name nor as a module. A no-op without mmengine."""
    try:
        from mmengine.config import utils as config_utils
    except ImportError:
        return
    from ..distributions import PACKAGES, installed_version
    table = config_utils.MODULE2PACKAGE
    table.setdefault('mmvit_ext', 'mmvit_ext')
    for pkg in PACKAGES:
        if (table.get(pkg.module) == pkg.openmmlab != pkg.module
                and installed_version(pkg.openmmlab) is None and installed_version(pkg.onedl)):
            table[pkg.module] = pkg.onedl


__all__ = ['config_root', 'list_configs', 'config_path', 'register_scope', 'PREFIX']
