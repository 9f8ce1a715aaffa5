"""Hand-computed tensors of the loss and advantage tests: float64, so values compare to many digits."""

from __future__ import annotations

import torch

D = torch.float64


def t(x, dtype: torch.dtype = D) -> torch.Tensor:
    """`x` (numbers, nested lists) as a tensor, float64 unless `dtype` says otherwise."""
    return torch.tensor(x, dtype=dtype)
