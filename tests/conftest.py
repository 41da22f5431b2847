import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/official_layouts.py helpers

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_leaked_default_scope():
    """A runner built by one test makes its scope mmengine's current default scope for every
    later test (registries then resolve names in that scope); restore the set after each test."""
    from mmengine.registry import DefaultScope
    before = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(before)
