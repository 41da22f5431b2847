"""Reading checkpoint files safely: safetensors, or torch.load with ``weights_only=True``.

``http(s)://`` checkpoints are fetched into the torch hub cache
(``torch.hub.get_dir()/checkpoints/<file name>``, where mmengine's ``load_from_http`` and
``torch.hub`` keep them too) and read from there with the same safe reader.
"""
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional, Union
from urllib.parse import urlparse

import torch

from .. import torch_compat
from ..utils.safe_checkpoint import trusted_training_state

PathLike = Union[str, Path]
WRAPPER_KEYS = ('model', 'state_dict', 'state_dict_ema', 'model_ema', 'module')
STRIP_PREFIXES = ('module.', 'backbone.')
# top-level keys of a backbone that holds its trunk as ``backbone`` (the official DINOv3_Adapter)
HOLDS_BACKBONE = ('interactions.', 'level_embed')


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used, with the reason and the file named."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file that does not exist: also the ``OSError`` that ``torch.load`` and the
    peers' loaders raise."""


def is_url(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(('http://', 'https://'))


def hub_cache_path(url: str) -> Path:
    """Where torch.hub / mmengine keep the file of ``url``."""
    return Path(torch.hub.get_dir()) / 'checkpoints' / os.path.basename(urlparse(url).path)


def resolve_checkpoint(path: PathLike, download: bool = True) -> Path:
    """A local path for ``path``: itself, or for a URL its file in the torch hub cache,
    downloaded there first when absent (``download=True``).

    Raises :class:`CheckpointError` naming the URL, the file and where to put it when the file
    is not cached and cannot be downloaded (no network)."""
    if not is_url(path):
        if isinstance(path, str) and '://' in path:
            raise CheckpointError(f'checkpoint {path}: only local files and http(s):// URLs are '
                                  f'read by mmvit_ext backbones (scheme {path.split("://")[0]}:// '
                                  f'is not); download the file and pass its path')
        return Path(path)
    cached = hub_cache_path(path)
    if cached.is_file():
        return cached
    reason = 'not in the torch hub cache'
    if download:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(path, str(cached), progress=False)
            return cached
        except (OSError, ValueError, RuntimeError) as err:  # URLError, HTTPError, timeouts
            reason = f'download failed: {type(err).__name__}: {err}'
    raise CheckpointError(
        f'checkpoint {path} is not available ({reason}). Without network, fetch '
        f'{cached.name} elsewhere and put it at {cached} (the torch hub cache, shared with '
        f'mmengine and torch.hub; TORCH_HOME moves it)')


TRAINING_STATE = 'training-state checkpoints'  # a feature of torch_compat.NEEDS


def read_checkpoint(path: PathLike, map_location: Union[str, torch.device] = 'cpu') -> Any:
    """Load ``.safetensors`` or a torch file without executing pickled code; a URL is read from
    the torch hub cache (downloaded there first when needed).

    Raises :class:`CheckpointError` for a missing, empty, truncated or unsafe file.
    """
    path = resolve_checkpoint(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f'checkpoint file not found: {path}')
    if path.stat().st_size == 0:
        raise CheckpointError(f'checkpoint file is empty (0 bytes): {path}')
    if path.suffix == '.safetensors':
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device=str(map_location))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f'cannot read safetensors checkpoint {path}: {err}') from err
    try:
        with trusted_training_state():  # mmengine / timm training state, for this load only
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if not torch_compat.supports(TRAINING_STATE):  # no allowlist: only tensors and containers
            raise CheckpointError(f'refused to load {path}: it holds pickled objects (training '
                                  f'state?) and {torch_compat.unsupported_message(TRAINING_STATE)}'
                                  f'; save its state_dict alone, or load it on a newer torch'
                                  ) from err
        raise CheckpointError(
            f'refused to load {path}: it holds pickled objects outside the safe allowlist, so it '
            f'could run code when unpickled. Only tensors, containers and the allowlisted '
            f'OpenMMLab training state are accepted. Unpickler said: {str(err).splitlines()[0]}'
        ) from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f'cannot read checkpoint {path}: the file is truncated or not a '
                              f'torch/safetensors checkpoint ({type(err).__name__}: '
                              f'{str(err).splitlines()[0] if str(err) else ""})') from err


def unwrap_state_dict(checkpoint: Any, source: str = 'checkpoint',
                      prefix: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Find the weights inside a training checkpoint and normalise their names.

    Unwraps ``model`` / ``state_dict`` / ``state_dict_ema`` (first found, in that order), keeps only
    keys under ``prefix`` when given (stripped), and strips a ``module.`` / ``backbone.`` prefix
    shared by every key. Without ``prefix``, a whole detector / segmentor / classifier (some keys
    under ``backbone.``, others under ``neck.``, ``head.``...) gives its ``backbone.`` keys.
    """
    state = checkpoint
    for _ in range(3):  # e.g. {'state_dict': {'model': ...}}
        if isinstance(state, dict) and not _is_tensor_dict(state):
            key = next((k for k in WRAPPER_KEYS if isinstance(state.get(k), dict)), None)
            if key is None:
                break
            state = state[key]
    if not isinstance(state, dict) or not _is_tensor_dict(state):
        seen = list(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f'{source} holds no state dict of tensors (looked under '
                              f'{list(WRAPPER_KEYS)}; saw {seen})')
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not state:
            raise CheckpointError(f'{source} has no keys starting with prefix {prefix!r}')
    for strip in STRIP_PREFIXES:
        if all(k.startswith(strip) for k in state):
            state = {k[len(strip):]: v for k, v in state.items()}
    if not prefix and any(k.startswith('backbone.') for k in state) and not any(
            k.startswith(HOLDS_BACKBONE) for k in state):
        state = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    return state


def _is_tensor_dict(obj: dict) -> bool:
    return len(obj) > 0 and sum(isinstance(v, torch.Tensor) for v in obj.values()) * 2 >= len(obj)


def save_state_dict(state_dict: Dict[str, torch.Tensor], path: PathLike) -> None:
    """Write ``.safetensors`` or a torch file (by suffix), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + '.tmp')
    if path.suffix == '.safetensors':
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(tmp))
    else:
        torch.save({'state_dict': state_dict}, tmp)
    tmp.replace(path)
