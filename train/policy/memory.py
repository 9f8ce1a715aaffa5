"""Peak live tensor bytes of a call, on any device: the CPU stand-in for `torch.cuda.max_memory_allocated`.

GPU memory properties (a micro-batch's peak is bounded by its token budget, not by its longest row) are
proven on CPU by counting what the code allocates rather than what an allocator reserves. The tracker is a
`TorchDispatchMode`: every storage an op returns while it is active is counted from that moment until
Python frees it (a weak reference on the storage, the way torch's own `MemTracker` does it), storages
resized in place (FSDP2 frees and re-allocates unsharded parameters with `UntypedStorage.resize_`) are
re-counted at their new size, and the peak of the running total is kept. Backward ops are seen too
(autograd carries the mode to its threads). Tensors that existed before the call are not counted, so the
figure is the call's growth above its starting point; wrapper subclasses (DTensor) count their local
tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary, weakref

T = TypeVar("T")


def _storages(t: object) -> list[torch.UntypedStorage]:
    if not isinstance(t, torch.Tensor):
        return []
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [s for name in names for s in _storages(getattr(t, name))]
    if t.is_sparse or t.is_nested or t.device.type == "meta":
        return []
    return [t.untyped_storage()]


class LiveTensorBytes(TorchDispatchMode):
    """Running and peak bytes of the storages allocated while active (`with LiveTensorBytes() as m:`)."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._counted: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [bytes counted]
        self._refs: set = set()  # the weak references whose callbacks subtract a freed storage
        self._resize = torch.UntypedStorage.resize_

    def _add(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def _track(self, storage: torch.UntypedStorage) -> None:
        if storage in self._counted:
            return
        cell = [storage.nbytes()]  # what the callback subtracts: the size counted last (resizes change it)
        self._counted[storage] = cell

        def freed(ref, cell=cell) -> None:
            self.current -= cell[0]
            self._refs.discard(ref)

        self._refs.add(weakref.ref(storage, freed))
        self._add(cell[0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                for storage in _storages(t):
                    self._track(storage)
        return out

    def __enter__(self) -> LiveTensorBytes:
        original, counted, add = self._resize, self._counted, self._add

        def resize_(storage: torch.UntypedStorage, size: int):
            result = original(storage, size)
            cell = counted.get(storage)
            if cell is not None:
                add(storage.nbytes() - cell[0])
                cell[0] = storage.nbytes()
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)


def peak_tensor_bytes(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, int]:
    """(fn(*args, **kwargs), the peak bytes of tensors it allocated that were alive at one time)."""
    with LiveTensorBytes() as tracker:
        result = fn(*args, **kwargs)
    return result, tracker.peak
