"""A dispatch mode that records the names of the aten ops a block of code runs (tests of which
kernels a forward / backward reaches)."""
from torch.utils._python_dispatch import TorchDispatchMode


class RecordOpNames(TorchDispatchMode):
    """``with RecordOpNames() as record: ...``; then ``record.names`` holds the op names."""

    def __init__(self) -> None:
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.__name__)
        return func(*args, **(kwargs or {}))
