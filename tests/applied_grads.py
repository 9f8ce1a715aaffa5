"""The gradients an optimizer step of a `Policy` applies, for tests that compare them: `train_step` frees its
gradients once applied (they would otherwise stay allocated through the next rollout), so they are copied
from an optimizer step pre-hook (torch's `Optimizer.register_step_pre_hook`), full tensors by parameter name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def applied_grads(policy) -> Iterator[dict[str, torch.Tensor]]:
    """`with applied_grads(policy) as grads: policy.train_step(...)`: `grads` holds the last step's gradients
    (a collective under several ranks: every rank steps, so every rank gathers)."""
    grads: dict[str, torch.Tensor] = {}

    def copy(optimizer, args, kwargs) -> None:
        grads.clear()
        for name, param in policy.model.named_parameters():
            if param.grad is not None:
                g = param.grad
                grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()

    handle = policy.optimizer.register_step_pre_hook(copy)
    try:
        yield grads
    finally:
        handle.remove()
