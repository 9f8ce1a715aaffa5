"""PyTorch's CUDA allocator in expandable segments while the policy trains, in fixed segments while the
rollout engine wakes and takes the weights (verl's `set_expandable_segments`: False before the rollout
resumes, True once it sleeps again).

Why: an update's peak is its live tensors plus the fragmentation of the allocator's fixed segments: measured
reserved / planned 1.09 (shared layout) and 1.20 (plain layout) at 6 layers of Qwen3-4B (docs/gpu.md).
Expandable segments grow one mapping per stream instead of leaving gaps between fixed blocks. vLLM's sleep
allocator (CuMemAllocator) maps its own memory and does not mix with them, so they are off from the weight
sync (the engine's wake-up) to the end of generation. A no-op without CUDA; the state is kept all the same,
so the order of switches is the same on every machine (tests/test_segments.py)."""

from __future__ import annotations

import torch

_state: bool | None = None  # None: never set by this module (the process's PYTORCH_CUDA_ALLOC_CONF holds)
switches: list[bool] = []  # every change of state, in order (what a CPU test can observe)


def set_expandable_segments(enable: bool) -> None:
    """Switch the CUDA caching allocator's `expandable_segments` (only on a change; a no-op on CPU)."""
    global _state
    if _state == enable:
        return
    if torch.cuda.is_available():
        torch.cuda.memory._set_allocator_settings(f"expandable_segments:{enable}")
    _state = enable
    switches.append(enable)


def expandable_segments() -> bool | None:
    """The state this module last set (None: never set)."""
    return _state


def for_training() -> None:
    """The policy computes: log-prob passes and updates (Policy.compute_log_probs / train_step)."""
    set_expandable_segments(True)


def for_engine() -> None:
    """The engine wakes and takes the weights, then generates (weight_sync.sync_weights)."""
    set_expandable_segments(False)
