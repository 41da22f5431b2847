import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/official_layouts.py helpers

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _scope_baseline() -> dict:
    from mmengine.registry import DefaultScope
    return DefaultScope._instance_dict.copy()


_SCOPES_AT_START = _scope_baseline()


@pytest.fixture(autouse=True)
def _no_leaked_default_scope():
    """A runner built by one test, or by a module-scoped fixture (which runs before this
    fixture), makes its scope mmengine's current default scope for every later test
    (registries then resolve names in that scope); restore the session's starting set after
    each test."""
    from mmengine.registry import DefaultScope
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(_SCOPES_AT_START)


def pytest_configure(config: pytest.Config) -> None:
    """In CI, print the 25 slowest tests (the suite's time budget is watched there)."""
    if os.environ.get('CI') and not config.option.durations:
        config.option.durations = 25
