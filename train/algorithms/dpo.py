"""DPO's loss (Rafailov et al. 2023, sigmoid form) on summed response log-probs; the DPO stage is
train/stages/dpo.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from train.algorithms.aggregation import Number

__all__ = [
    "dpo_loss",
]


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    *,
    global_pair_count: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO (sigmoid) loss: mean over pairs of -log sigmoid(beta*((pi_c - ref_c) - (pi_r - ref_r))).

    All inputs (B,): summed response log-probs of the chosen/rejected answers. Returns (loss scalar,
    metrics) with ``rewards/chosen`` mean beta*(pi_c - ref_c), ``rewards/rejected``,
    ``rewards/accuracy`` share of pairs with chosen reward > rejected reward, ``rewards/margin``
    mean (chosen - rejected). ``global_pair_count``: divide by the mini-batch's pair count instead
    of B (micro-batches, as for ``agg_loss``).
    """
    chosen = beta * (policy_chosen_logps - ref_chosen_logps)
    rejected = beta * (policy_rejected_logps - ref_rejected_logps)
    losses = -F.logsigmoid(chosen - rejected)
    denom = losses.shape[0] if global_pair_count is None else global_pair_count
    loss = losses.sum() / denom if float(denom) > 0 else losses.sum() * 0.0
    with torch.no_grad():
        metrics = {
            "rewards/chosen": chosen.mean().item(),
            "rewards/rejected": rejected.mean().item(),
            "rewards/accuracy": (chosen > rejected).float().mean().item(),
            "rewards/margin": (chosen - rejected).mean().item(),
        }
    return loss, metrics
