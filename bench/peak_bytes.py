"""Peak live tensor bytes of a call on any device (the CPU stand-in for torch.cuda.max_memory_allocated).

A small `TorchDispatchMode`: each storage an op returns while it is active is counted until Python frees it
(a weak reference on the storage), and the running total's peak is kept; tensors that existed before the
call are not counted. Interim copy for the planner's test (tests/test_plan_measured.py): helper `gpu` of
issue 24 writes the project's tracker as train/policy/memory.py (same `peak_tensor_bytes` API, which also
follows FSDP2's in-place storage resizes); once that is on main this file goes and the test imports it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


class _Live(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.current = self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def _track(self, t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):
            for name in t.__tensor_flatten__()[0]:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    self._track(inner)
            return
        if t.device.type == "meta" or t.is_sparse:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._seen and self._seen[key]() is not None:
            return
        size = storage.nbytes()

        def freed(_ref, size=size, key=key) -> None:
            self.current -= size
            self._seen.pop(key, None)

        self._seen[key] = weakref.ref(storage, freed)
        self.current += size
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def peak_tensor_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """(fn(*args, **kwargs), the peak bytes of the tensors it allocated that were alive at one time)."""
    with _Live() as live:
        result = fn(*args, **kwargs)
    return result, live.peak
