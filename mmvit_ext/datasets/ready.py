"""The READY marker of a generated demo set: written last, so a half-written set is never used."""
import json
from pathlib import Path
from typing import Any, Union


def write_ready(root: Union[str, Path], version: int, **settings: Any) -> None:
    """Record the settings (and generator version) a finished set was made with."""
    made = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    (Path(root) / 'READY').write_text(json.dumps(dict(made, version=version)))


def is_ready(root: Union[str, Path], version: int, **settings: Any) -> bool:
    """True when ``root`` holds a finished set made by this generator version with ``settings``."""
    marker = Path(root) / 'READY'
    if not marker.is_file():
        return False
    made = json.loads(marker.read_text())
    return made.get('version') == version and all(
        made.get(k) == (list(v) if isinstance(v, tuple) else v) for k, v in settings.items())
