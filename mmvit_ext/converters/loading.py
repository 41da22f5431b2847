"""Loading a pretrained checkpoint into one of our backbones through ``init_cfg``."""
from dataclasses import dataclass, field
from typing import List, Optional

from mmengine.logging import print_log
from torch import nn

from .io import CheckpointError, PathLike, read_checkpoint, unwrap_state_dict
from .layouts import StateDict, detect_layouts


@dataclass
class LoadReport:
    """What happened to every key: for logs, tests and the conversion tool."""
    layout: str
    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    resized: List[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f'layout: {self.layout}; loaded {len(self.loaded)} tensors']
        for name in ('resized', 'dropped', 'missing', 'unexpected'):
            keys = getattr(self, name)
            if keys:
                lines.append(f'{name} ({len(keys)}): {", ".join(keys)}')
        return '\n'.join(lines)


def convert_for_model(model: nn.Module, state_dict: StateDict, source: str = 'checkpoint'):
    """Detect the layout, check it belongs to the model's family, convert to our key names."""
    family = getattr(model, 'family', None)
    layouts = detect_layouts(state_dict)
    foreign = [lay for lay in layouts if lay.family != family]
    if foreign and not any(lay.family == family for lay in layouts):
        raise CheckpointError(
            f'{source} looks like an {foreign[0].name} checkpoint, which belongs to the '
            f'{foreign[0].family!r} family; {type(model).__name__} loads {family!r} checkpoints')
    layout_name = 'mmvit_ext'
    for layout in (lay for lay in layouts if lay.family == family):
        if layout.convert is None:
            raise CheckpointError(f'{source} is in the {layout.name} layout, which '
                                  f'{type(model).__name__} has no converter for')
        state_dict = layout.convert(state_dict)
        layout_name = layout.name
    return state_dict, layout_name


def load_pretrained(model: nn.Module, path: PathLike, prefix: Optional[str] = None,
                    map_location: str = 'cpu', logger: str = 'current') -> LoadReport:
    """Read, unwrap, convert, adapt (resize tables / embeddings) and load into ``model``.

    Missing and unused keys are logged by name; shape mismatches and foreign layouts raise
    :class:`CheckpointError`.
    """
    checkpoint = read_checkpoint(path, map_location)
    state_dict = unwrap_state_dict(checkpoint, source=f'checkpoint {path}', prefix=prefix)
    state_dict, layout = convert_for_model(model, state_dict, source=f'checkpoint {path}')
    report = LoadReport(layout=layout)
    adapt = getattr(model, 'adapt_state_dict', None)
    if adapt is not None:
        state_dict, report.resized = adapt(state_dict)

    own = model.state_dict()
    non_persistent = {name for name, _ in model.named_buffers()} - set(own)
    unused = getattr(model, 'unused_checkpoint_keys', None)
    unused = set(unused(list(state_dict))) if unused is not None else set()
    report.dropped = sorted(k for k in state_dict if k in non_persistent or k in unused)
    state_dict = {k: v for k, v in state_dict.items() if k not in non_persistent and k not in unused}
    if not set(state_dict) & set(own):
        raise CheckpointError(
            f'checkpoint {path} shares no key with {type(model).__name__} (layout not recognised); '
            f'it has keys like {sorted(state_dict)[:5]}, the model expects keys like {sorted(own)[:5]}')
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}'
                  for k, v in state_dict.items() if k in own and v.shape != own[k].shape]
    if mismatched:
        raise CheckpointError(f'checkpoint {path} does not fit {type(model).__name__} '
                              f'({len(mismatched)} shape mismatches; wrong arch?): '
                              + '; '.join(mismatched[:10]))
    result = model.load_state_dict(state_dict, strict=False)
    report.missing, report.unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    report.loaded = sorted(set(state_dict) & set(own))
    print_log(f'{type(model).__name__}: loaded {path}\n{report.summary()}', logger=logger)
    return report
