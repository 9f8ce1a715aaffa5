"""Outcome advantage estimators (verl ``core_algos`` semantics), as pure tensor functions.

Every function has the signature ``fn(scores, group_index, response_mask, **estimator_kwargs) -> (B, T)``:

- ``scores``: ``(B,)`` one outcome reward per response, or ``(B, T)`` token-level rewards (summed over the
  response for the group estimators, as verl does after the in-reward KL penalty);
- ``group_index``: ``(B,)`` integer tensor; responses with the same value were sampled for the same prompt;
- ``response_mask``: ``(B, T)``, 1 on valid response tokens, 0 on padding.

The result is the per-token advantage, zero on masked tokens. Each is registered in the method table
(train/algorithms/registry.py) by a short ``(cfg, ctx)`` entry beside it, selected by
``algorithm.adv_estimator``. Nothing here needs gradients: everything runs under ``torch.no_grad()``.
"""

from __future__ import annotations

import torch

from train.algorithms.registry import AdvantageContext, Knob, register_adv_estimator

NORM_BY_STD = Knob(True, "divide GRPO advantages by the group std (False = Dr.GRPO: s - group mean)")

__all__ = [
    "compute_grpo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "masked_whiten",
    "scores_to_token_rewards",
]


def _float(x: torch.Tensor) -> torch.Tensor:
    """Float copy of ``x`` (keeps float64 for exact tests, promotes ints/bools/halves to float32)."""
    if x.dtype == torch.float64:
        return x.clone()
    return x.to(torch.float32)


def _sequence_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) scores from (B,) scores or (B, T) token-level rewards (masked sum over the response)."""
    if scores.dim() == 1:
        return _float(scores)
    if scores.dim() == 2:
        return (_float(scores) * response_mask.to(_float(scores).dtype)).sum(dim=-1)
    raise ValueError(f"scores must be (B,) or (B, T), got shape {tuple(scores.shape)}")


def _group_ids(group_index: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, int]:
    """Dense group ids in [0, G) so per-group statistics can be computed with scatter-add."""
    group_index = torch.as_tensor(group_index)
    if group_index.shape != (batch_size,):
        raise ValueError(f"group_index must have shape ({batch_size},), got {tuple(group_index.shape)}")
    if batch_size == 0:
        return group_index.long(), 0
    _, inverse = torch.unique(group_index, return_inverse=True)
    return inverse.to(group_index.device), int(inverse.max().item()) + 1


def _group_stats(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-response group size n, mean and unbiased std of its group's scores, each (B,).

    Two-pass (mean, then squared deviations) like ``torch.std``, so an all-equal group has std exactly 0.
    Groups of one get std NaN here; the callers replace it.
    """
    ids, n_groups = _group_ids(group_index, scores.shape[0])
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).scatter_add_(
        0, ids, torch.ones_like(scores)
    )
    total = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).scatter_add_(0, ids, scores)
    mean = total / count
    sq_dev = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).scatter_add_(
        0, ids, (scores - mean[ids]) ** 2
    )
    std = torch.sqrt(sq_dev / (count - 1))
    return count[ids], mean[ids], std[ids]


def scores_to_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each response's scalar score on its last valid token (verl's outcome-reward layout).

    scores: (B,); response_mask: (B, T) -> token_level_rewards: (B, T). A response with no valid token
    gets no reward anywhere. The last valid token is the last 1 in the mask (works for left-aligned
    responses, which is how responses are laid out after the prompt).
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"need scores (B,) and response_mask (B, T), got {tuple(scores.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=-1).values  # (B,)
    s = _float(scores)
    out = torch.zeros(mask.shape, dtype=s.dtype, device=s.device)
    has_token = last >= 0
    rows = torch.nonzero(has_token, as_tuple=True)[0]
    out[rows, last[rows]] = s[rows]
    return out


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the valid tokens of the whole batch (verl ``masked_whiten``).

    values, mask: (B, T). Mean and Bessel-corrected variance use only tokens where mask is 1; masked
    positions are returned shifted/scaled too (multiply by the mask afterwards). Fewer than 2 valid
    tokens leave nothing to scale by: the result is centred only (all zeros on the valid tokens).
    """
    m = mask.to(values.dtype)
    n = m.sum()
    if n == 0:
        return torch.zeros_like(values)
    if n == 1:  # no spread to estimate: centre only (the single valid token becomes 0)
        return values - (values * m).sum()
    mean = (values * m).sum() / n
    var = (((values - mean) ** 2) * m).sum() / n * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + eps)


@torch.no_grad()
def compute_grpo_outcome_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """GRPO: A_i = (s_i - mean_g) / (std_g + epsilon), broadcast over the response tokens.

    scores: (B,) or (B, T); group_index: (B,); response_mask: (B, T) -> advantages (B, T).
    std is the unbiased (Bessel) std of the group; a group of one uses mean 0, std 1 (so A = s/(1+eps)).
    ``norm_adv_by_std_in_grpo=False`` gives Dr.GRPO's A_i = s_i - mean_g (a group of one: A = s).
    """
    s = _sequence_scores(scores, response_mask)
    count, mean, std = _group_stats(s, group_index)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


@torch.no_grad()
def compute_rloo_outcome_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """RLOO: leave-one-out baseline, A_i = s_i - mean_{j != i} s_j = n/(n-1) * (s_i - mean_g).

    scores: (B,) or (B, T); group_index: (B,); response_mask: (B, T) -> advantages (B, T).
    A group of one has no other sample, so its baseline is 0 and A = s (verl behaviour).
    """
    s = _sequence_scores(scores, response_mask)
    count, mean, _ = _group_stats(s, group_index)
    single = count == 1
    safe = torch.where(single, torch.full_like(count, 2.0), count)  # avoid 0/0 in the unused branch
    adv = torch.where(single, s, (s - mean) * safe / (safe - 1))
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor | None,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
) -> torch.Tensor:
    """REINFORCE++: discounted token returns, whitened over all valid tokens of the batch.

    scores: (B,) outcome scores (placed on the last valid token) or (B, T) token-level rewards;
    group_index: ignored (no group baseline; kept for the common signature); response_mask: (B, T)
    -> advantages (B, T). G_t = r_t + gamma * G_{t'}, t' the next *valid* token, then ``masked_whiten``
    (batch mean / unbiased std of the valid tokens) times the mask.

    Masked positions are skipped, not reset at: a multi-turn trajectory's environment tokens (mask 0 between
    model turns) carry the return through undiscounted, so every model turn gets the outcome, discounted
    over model tokens only (as GAE here and verl's GAE skip them); rewards on masked tokens are dropped.
    verl's REINFORCE++ resets the return at every masked token ("reset after EOS"), which in a multi-turn
    trajectory gives the turns before an environment segment no outcome credit; on single-turn responses
    (padding after the end only) the two agree.
    """
    mask = response_mask.to(torch.float64 if scores.dtype == torch.float64 else torch.float32)
    rewards = scores_to_token_rewards(scores, response_mask) if scores.dim() == 1 else _float(scores)
    rewards = rewards.to(mask.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        running = valid * (rewards[:, t] + gamma * running) + (1 - valid) * running
        returns[:, t] = running
    return masked_whiten(returns, mask) * mask


@torch.no_grad()
def compute_remax_outcome_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor | None,
    response_mask: torch.Tensor,
    baselines: torch.Tensor | None = None,
) -> torch.Tensor:
    """ReMax: A = return - b, b = score of the greedy response to the same prompt.

    scores: (B,) or (B, T) token-level rewards; group_index: ignored; response_mask: (B, T);
    baselines: (B,) the greedy baseline score for each response's prompt -> advantages (B, T).
    With an outcome score the return is s_i on every valid token, so A = (s_i - b_i) * mask.
    """
    if baselines is None:
        raise ValueError("remax needs baselines=(B,) greedy-response scores")
    rewards = scores_to_token_rewards(scores, response_mask) if scores.dim() == 1 else _float(scores)
    mask = response_mask.to(rewards.dtype)
    returns = (rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    return (returns - _float(baselines).unsqueeze(-1)) * mask


# ---- the method-table entries: config + context -> the pure functions above ------------------------
@register_adv_estimator("grpo", knobs={"norm_adv_by_std_in_grpo": NORM_BY_STD})
def grpo(cfg, ctx: AdvantageContext) -> torch.Tensor:
    return compute_grpo_outcome_advantage(
        ctx.rewards(), ctx.group_index, ctx.response_mask, norm_adv_by_std_in_grpo=cfg.norm_adv_by_std_in_grpo
    )


@register_adv_estimator("rloo")
def rloo(cfg, ctx: AdvantageContext) -> torch.Tensor:
    return compute_rloo_outcome_advantage(ctx.rewards(), ctx.group_index, ctx.response_mask)


@register_adv_estimator(
    "reinforce_plus_plus",
    knobs={"gamma": Knob(1.0, "discount of later token rewards (GAE, REINFORCE++)", float, valid=lambda g: 0 <= g <= 1, rule="in [0, 1]")},
)  # fmt: skip
def reinforce_plus_plus(cfg, ctx: AdvantageContext) -> torch.Tensor:
    return compute_reinforce_plus_plus_outcome_advantage(
        ctx.rewards(), ctx.group_index, ctx.response_mask, gamma=cfg.gamma
    )


@register_adv_estimator("remax", needs=("baseline_scores",))
def remax(cfg, ctx: AdvantageContext) -> torch.Tensor:
    return compute_remax_outcome_advantage(
        ctx.rewards(), ctx.group_index, ctx.response_mask, baselines=ctx.baseline_scores
    )
