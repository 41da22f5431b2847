import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/official_layouts.py helpers

# two threads, or the cores' share of each pytest-xdist worker (``-n 2`` on 2 cores: one each,
# tools and launchers started by the tests included), so that workers never oversubscribe
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
if _WORKERS > 1:
    os.environ['OMP_NUM_THREADS'] = str(THREADS)
torch.set_num_threads(THREADS)


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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption('--install-lines', action='store_true',
                     help="run the docs' install lines for real (new venvs, pip, network): "
                          'tests/test_install_lines.py; tools/test_stack.sh passes it')
    parser.addoption('--unpinned-torch', action='store_true',
                     help="with --install-lines: the new-environment blocks with their torch line "
                          "unpinned, as the day's index resolves it (by hand, every stop)")


def pytest_configure(config: pytest.Config) -> None:
    """In CI, print the 25 slowest tests (the suite's time budget is watched there)."""
    config.addinivalue_line('markers', 'install_lines: runs install lines for real '
                                       '(selected by --install-lines, deselected otherwise)')
    if os.environ.get('CI') and not config.option.durations:
        config.option.durations = 25


# Under pytest-xdist (``-n 2``), files measured slowest (seconds at one thread each, 2026-11-27;
# test_learning 2026-11-28) start first, so that the short ones fill in around them instead of
# one core finishing alone
SLOW_FILES_FIRST = ('test_onnx_export.py',  # 398
                    'test_gpu_check.py',  # 364: every step, CPU variant
                    'test_configs.py',  # 260+
                    'test_learning.py',  # 131 s of CPU: a Mask R-CNN trained for 128 iterations
                    'test_numerics.py', 'test_resume.py', 'test_seg_learning.py')


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The install-line runs only with --install-lines (and then only they run); in xdist
    workers, the collection ordered slowest files first (see SLOW_FILES_FIRST)."""
    wanted = config.getoption('--install-lines')
    chosen = [(item.get_closest_marker('install_lines') is not None) == wanted for item in items]
    if not all(chosen):
        config.hook.pytest_deselected(items=[i for i, keep in zip(items, chosen) if not keep])
        items[:] = [i for i, keep in zip(items, chosen) if keep]
    if _WORKERS > 1:
        rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable otherwise


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``-n N`` alone (xdist's ``load``): whole files per worker, so that a module's fixtures are
    built once, handed out in the collection's order (SLOW_FILES_FIRST) rather than xdist's
    most-tests-first. Any other ``--dist`` is xdist's own."""
    if config.getvalue('dist') != 'load':
        return None
    from xdist.scheduler import LoadFileScheduling
    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)

