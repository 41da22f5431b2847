"""The peers' own backbone unit tests, run against ours: each file ``test_<peer>_<name>.py``
builds in that peer's default scope, as the peer's configs run, so ours follows the peer's
semantics where the peers differ (docs/peer_semantics.md)."""
import pytest
from mmengine.registry import DefaultScope

PEERS = ('mmdet', 'mmseg', 'mmpretrain')


@pytest.fixture(autouse=True)
def peer_scope(request):
    """The default scope named by the test file (``test_mmseg_vit.py`` -> ``'mmseg'``)."""
    peer = request.module.__name__.rpartition('.')[2].split('_')[1]
    assert peer in PEERS, f'{request.module.__name__}: name peer test files test_<peer>_*.py'
    with DefaultScope.overwrite_default_scope(peer):
        yield peer
