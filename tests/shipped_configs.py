"""The shipped configs (configs/, bases aside), each loaded once per test process: mmengine reads
the peers' metafiles again for every ``mmdet::`` / ``mmseg::`` base, about 2 s a config."""
import functools
from pathlib import Path
from typing import List

from mmengine.config import Config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS: List[str] = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'configs').rglob('*.py')
                            if '_base_' not in p.parts)


@functools.lru_cache(maxsize=None)
def load(config: str) -> Config:
    """``config`` (relative to the repository root) as mmengine loads it; shared: do not edit."""
    return Config.fromfile(str(ROOT / config))
