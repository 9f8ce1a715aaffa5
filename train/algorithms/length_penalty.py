"""A response-length penalty on the reward: longer answers cost a little, whatever else they earn.

r_i <- r_i - length_penalty_coef * |y_i| / max_new_tokens, i.e. the coefficient is the penalty of a response
that uses the whole length budget (``rollout.max_new_tokens``), linear in its length below that. Unlike
DAPO's overlong shaping (``dapo.py``), which only touches responses near the limit, this pushes every
response towards brevity; with GRPO's group-normalised advantages only the length differences within a
group matter. Off by default (``algorithm.length_penalty_coef=0``).
"""

from __future__ import annotations

import torch

from train.algorithms.registry import Knob, register_step

__all__ = ["LENGTH_PENALTY_KNOBS", "length_penalty"]


def length_penalty(response_lengths: torch.Tensor, max_new_tokens: int, coef: float) -> torch.Tensor:
    """(B,) lengths in tokens -> (B,) penalties to add to the scores: -coef * length / max_new_tokens."""
    return -coef * response_lengths.to(torch.float32) / max_new_tokens


LENGTH_PENALTY_KNOBS = {
    "length_penalty_coef": Knob(
        0.0, "reward penalty of a response as long as rollout.max_new_tokens (linear in length; 0 = off)",
        float, valid=lambda c: c >= 0, rule=">= 0",
    ),
}  # fmt: skip


@register_step(
    "length_penalty",
    "after_reward",
    enabled=lambda cfg: cfg.length_penalty_coef > 0,
    knobs=LENGTH_PENALTY_KNOBS,
)
def length_penalty_step(cfg, batch, ctx) -> dict[str, float]:
    """Add :func:`length_penalty` to ``batch["rewards"]`` (B,)."""
    penalty = length_penalty(batch["response_mask"].sum(-1), ctx.max_new_tokens, cfg.length_penalty_coef)
    batch["rewards"] = batch["rewards"] + penalty
    return {"train/length_penalty_mean": float(penalty.mean())}
