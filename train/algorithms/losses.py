"""Policy-gradient losses, KL penalties and log-prob/entropy helpers (verl ``core_algos`` semantics).

Pure tensor functions. Shapes: B sequences, T padded response length, V vocabulary. ``response_mask``
is 1 on valid response tokens.

Micro-batching contract (gradient accumulation). Every loss here that averages over tokens or sequences
takes optional *global* normalisers. Compute them once on the whole mini-batch with
:func:`global_normalisers`, pass them (``**norms``) to every micro-batch call, and call ``backward()`` on
each micro-batch loss as is (do NOT divide by the number of micro-batches): the sum of the micro-batch
losses is then exactly the mini-batch loss, so the accumulated gradient equals the one-big-batch gradient
for every ``loss_agg_mode``, whatever the split (token-budget micro-batches included). Without them each
call normalises by its own inputs (right for a single batch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from train.algorithms.advantages import scores_to_token_rewards
from train.algorithms.registry import Knob, policy_loss_from

__all__ = [
    "KL_PENALTIES",
    "LOSS_AGG_MODES",
    "actor_loss",
    "agg_loss",
    "apply_kl_in_reward",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "global_normalisers",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_normalize",
    "policy_loss",
    "vanilla_policy_loss",
]

Number = int | float | torch.Tensor

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1, over all elements or along ``dim`` (CS336's
    ``masked_mean``). An empty mask (a fully masked row along ``dim``) gives 0, where the course's
    definition gives NaN (0/0): 0 keeps a padding row from poisoning a loss. Any shape."""
    keep = mask.bool()
    masked = torch.where(keep, values, torch.zeros_like(values))
    if dim is None:
        return masked.sum() / keep.sum().clamp(min=1)
    return masked.sum(dim=dim) / keep.sum(dim=dim).clamp(min=1)


def masked_normalize(
    values: torch.Tensor, mask: torch.Tensor, normalize_constant: float = 1.0, dim: int | None = None
) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1, over all elements or along ``dim``, divided by
    ``normalize_constant`` (CS336's ``masked_normalize``; a fully masked row gives 0)."""
    keep = mask.bool()
    masked = torch.where(keep, values, torch.zeros_like(values))
    return (masked.sum() if dim is None else masked.sum(dim=dim)) / normalize_constant


def _check_mode(loss_agg_mode: str) -> None:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(LOSS_AGG_MODES)}")


def global_normalisers(
    response_mask: torch.Tensor, loss_scale_factor: Number | None = None
) -> dict[str, Number]:
    """Denominators of the whole mini-batch, to pass to every micro-batch's loss call.

    response_mask: (B, T) of the full mini-batch (before splitting). Returns
    ``global_token_count`` (valid tokens), ``global_seq_count`` (sequences with >= 1 valid token) and
    ``loss_scale_factor`` (the given one, else the mini-batch's padded length T: pass it explicitly, e.g.
    the configured max response length, if micro-batches are re-padded to their own lengths).
    """
    mask = response_mask.bool()
    return {
        "global_token_count": int(mask.sum().item()),
        "global_seq_count": int(mask.any(dim=-1).sum().item()),
        "loss_scale_factor": mask.shape[-1] if loss_scale_factor is None else loss_scale_factor,
    }


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: Number | None = None,
    *,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar, one of verl's ``loss_agg_mode`` s.

    loss_mat, loss_mask: (B, T) -> scalar. With ML = loss_mat * loss_mask and M = loss_mask:

    - ``token-mean``: sum(ML) / N_tok, N_tok = ``global_token_count`` or sum(M) of this call;
    - ``seq-mean-token-sum``: sum_b sum_t ML / N_seq;
    - ``seq-mean-token-mean``: sum_b (sum_t ML / sum_t M) / N_seq;
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): sum(ML) / ``loss_scale_factor`` (default T, the padded length).

    N_seq = ``global_seq_count`` or the number of sequences of this call with at least one valid token
    (fully masked rows, e.g. micro-batch padding rows, count nowhere and contribute 0). An empty
    denominator gives a 0 loss that still has a graph.
    """
    _check_mode(loss_agg_mode)
    mask = loss_mask.to(loss_mat.dtype)
    # where(), not a product: a non-finite value on a padded token must not leak into the loss (inf * 0).
    masked = torch.where(loss_mask.bool(), loss_mat, torch.zeros_like(loss_mat))
    zero = masked.sum() * 0.0
    if loss_agg_mode == "token-mean":
        denom = mask.sum() if global_token_count is None else global_token_count
        return zero if float(denom) == 0 else masked.sum() / denom
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if float(scale) <= 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {scale}")
        return masked.sum() / scale
    tokens_per_seq = mask.sum(dim=-1)
    seq_sum = masked.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_sum / tokens_per_seq.clamp(min=1)
    else:  # seq-mean-token-sum
        seq_loss = seq_sum
    denom = (tokens_per_seq > 0).sum() if global_seq_count is None else global_seq_count
    return zero if float(denom) == 0 else seq_loss.sum() / denom


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Number | None = None,
    *,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with dual clip (verl ``compute_policy_loss_vanilla``).

    old_log_prob, log_prob, advantages, response_mask: (B, T) -> (pg_loss scalar, metrics).
    rho = exp(clamp(logp - old_logp, -20, 20)); L = max(-A*rho, -A*clip(rho, 1-low, 1+high)); for A < 0
    L = min(-A*clip_ratio_c, L) (bounds the loss when rho explodes on a negative advantage).
    Metrics (token means over this call's mask): ``pg_clipfrac`` share of tokens where the clipped term
    is the larger one, ``ppo_kl`` mean(old_logp - logp) (clamped), ``pg_clipfrac_lower`` share of A < 0
    tokens where the dual clip is active.
    """
    pg_losses, metrics = _ppo_terms(
        old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    pg_loss = agg_loss(
        pg_losses,
        response_mask,
        loss_agg_mode,
        loss_scale_factor,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )
    return pg_loss, metrics


def _ppo_terms(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token dual-clip PPO loss (B, T) and the clip metrics of ``policy_loss``."""
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped1 = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_ratio_c
    clipped2 = torch.minimum(losses3, clipped1)
    pg_losses = torch.where(advantages < 0, clipped2, clipped1)
    with torch.no_grad():
        mask = response_mask.to(torch.float32)
        metrics = {
            "pg_clipfrac": masked_mean(torch.gt(losses2, losses1).float(), mask).item(),
            "ppo_kl": masked_mean(-neg_approx_kl.float(), mask).item(),
            "pg_clipfrac_lower": masked_mean(
                (torch.gt(clipped1, losses3) & (advantages < 0)).float(), mask
            ).item(),
        }
    return pg_losses, metrics


vanilla_policy_loss = policy_loss_from(
    "vanilla",
    _ppo_terms,  # the PPO clip + dual clip loss: per-token (B, T) loss and clip metrics
    {
        "clip_ratio_low": (0.2, "PPO clip: ratio >= 1 - clip_ratio_low"),
        "clip_ratio_high": (0.2, "PPO clip: ratio <= 1 + clip_ratio_high"),
        "clip_ratio_c": Knob(3.0, "dual-clip bound for negative advantages", float, valid=lambda c: c > 1, rule="> 1"),
    },
)  # fmt: skip


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference policy (verl ``kl_penalty``).

    log_prob, ref_log_prob: (B, T) -> (B, T). ``k1``/``kl``: logp - ref; ``abs``: |logp - ref|;
    ``k2``/``mse``: 0.5 (logp - ref)^2; ``k3``/``low_var_kl``: x = clamp(ref - logp, -20, 20),
    clamp(exp(x) - x - 1, -10, 10) (unbiased, non-negative, low variance; clamped for stability).
    A ``+`` suffix (``k1+``, ``k3+``, ...) is the straight-through variant: the value of the named
    estimator, the gradient of k2 (whose expected gradient is the true KL gradient; k1's and k3's are not).
    """
    straight_through = kind.endswith("+")
    base = kind[:-1] if straight_through else kind
    try:
        fn = KL_PENALTIES[base]
    except KeyError:
        valid = sorted(KL_PENALTIES) + [f"{k}+" for k in sorted(KL_PENALTIES)]
        raise ValueError(f"unknown KL penalty {kind!r}; valid: {valid}") from None
    value = fn(log_prob, ref_log_prob)
    if not straight_through:
        return value
    k2 = _kl_k2(log_prob, ref_log_prob)
    return k2 - k2.detach() + value.detach()


def _kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return log_prob - ref_log_prob


def _kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - ref_log_prob).abs()


def _kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob).square()


def _kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    x = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(x) - x - 1.0, min=-10.0, max=10.0)


KL_PENALTIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _kl_k1,
    "kl": _kl_k1,
    "abs": _kl_abs,
    "k2": _kl_k2,
    "mse": _kl_k2,
    "k3": _kl_k3,
    "low_var_kl": _kl_k3,
}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(z) - sum softmax(z) * z, computed in fp32.

    logits: (..., V) -> (...,) float32 (B, T, V -> B, T). Stable for large logits (no log of a
    probability that underflowed) and for -inf logits (masked vocabulary entries). Upcasts the whole tensor; see ``entropy_from_logits_chunked``.
    """
    z = logits.float()
    z = z - z.amax(dim=-1, keepdim=True).detach()  # shift-invariant; keeps fp32 precision for big logits
    finite_z = torch.where(torch.isneginf(z), torch.zeros_like(z), z)  # p = 0 there; avoids 0 * -inf = NaN
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * finite_z).sum(dim=-1)


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Same as ``entropy_from_logits`` but upcasts ``chunk_size`` positions at a time.

    logits: (..., V) -> (...,) float32. Peak extra memory is chunk_size * V floats instead of a full fp32
    copy; meant for the entropy metric under ``torch.no_grad()`` (with grad, each chunk is kept for backward).
    """
    flat = _rows(logits)
    if flat.shape[0] == 0:
        return torch.zeros(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    out = torch.cat([entropy_from_logits(c) for c in flat.split(chunk_size, dim=0)])
    return out.reshape(logits.shape[:-1])


class _ChunkedLogProb(torch.autograd.Function):
    """log_softmax(logits)[label] with fp32 maths per chunk, keeping only the logits for backward.

    Backward recomputes softmax chunk by chunk from the saved (low precision) logits and the fp32
    logsumexp, so no (N, V) fp32 tensor outlives a chunk.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int) -> torch.Tensor:
        lse = torch.cat([torch.logsumexp(c.float(), dim=-1) for c in logits.split(chunk_size, dim=0)])
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size
        return picked - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        n = ctx.chunk_size
        for start in range(0, logits.shape[0], n):
            sl = slice(start, start + n)
            g = grad_out[sl].float().unsqueeze(-1)
            chunk = -torch.exp(logits[sl].float() - lse[sl].unsqueeze(-1)) * g
            chunk.scatter_add_(-1, labels[sl].unsqueeze(-1), g)
            grad[sl] = chunk.to(grad.dtype)
        return grad, None, None


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """log p(label) under softmax(logits), per position.

    logits: (..., V) e.g. (B, T, V); labels: (...) long e.g. (B, T) -> (...) float32 (float64 for
    float64 logits). fp32/fp64: ``gather - logsumexp`` (backward keeps no (B, T, V) output tensor, unlike
    log_softmax). bf16/fp16: fp32 maths ``chunk_size`` positions at a time, never materialising a full
    fp32 copy of the logits, in forward or backward (precision matters: ratios exp(logp - old_logp)).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    labels = labels.long()
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    out = _ChunkedLogProb.apply(_rows(logits), labels.reshape(-1), chunk_size)
    return out.reshape(labels.shape)


def actor_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    pg_loss_fn: Callable | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    ref_log_prob: torch.Tensor | None = None,
    use_kl_loss: bool = False,
    kl_loss_coef: float = 0.001,
    kl_loss_type: str = "low_var_kl",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Number | None = None,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Actor loss = pg - entropy_coeff * agg(H) + kl_loss_coef * agg(kl(logp, ref)) (verl dp_actor).

    ``is_weights`` (B, T), detached: rollout/trainer importance weights (TIS, ``rollout_correction``)
    multiplying the per-token policy loss of whatever mode before aggregation; masked IS is applied by
    passing its mask as ``response_mask``.

    All tensors (B, T). ``pg_loss_fn(old_log_prob, log_prob, advantages, response_mask) -> (per-token
    loss, metrics)`` is the policy-loss mode (a registered entry with its config bound); without it,
    PPO clip + dual clip with the ``clip_ratio_*`` given here. ``entropy`` (B, T) is required when ``entropy_coeff != 0`` (it must carry grad
    then) and only reported otherwise; ``ref_log_prob`` is required when ``use_kl_loss``. Every term
    uses the same ``loss_agg_mode`` and normalisers (see the module docstring for micro-batches).
    Returns (loss, metrics) with metric keys ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
    ``actor/pg_clipfrac_lower``, plus ``actor/entropy`` when ``entropy`` is given and ``actor/kl_loss``,
    ``actor/kl_coef`` when ``use_kl_loss``. Metric values are this call's own aggregates (local
    normalisers), so averaging them over micro-batches gives the mini-batch value.
    """
    if entropy_coeff != 0 and entropy is None:
        raise ValueError("entropy_coeff != 0 needs the per-token entropy (B, T)")
    if use_kl_loss and ref_log_prob is None:
        raise ValueError("use_kl_loss=True needs ref_log_prob (B, T)")
    norms = {"global_token_count": global_token_count, "global_seq_count": global_seq_count}
    if pg_loss_fn is None:
        pg_losses, pg_metrics = _ppo_terms(
            old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
        )
    else:
        pg_losses, pg_metrics = pg_loss_fn(old_log_prob, log_prob, advantages, response_mask)
    if is_weights is not None:
        pg_losses = pg_losses * is_weights.detach()
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor, **norms)
    with torch.no_grad():
        pg_local = agg_loss(pg_losses.detach(), response_mask, loss_agg_mode, loss_scale_factor)
    metrics = {"actor/pg_loss": pg_local.item(), **{f"actor/{k}": v for k, v in pg_metrics.items()}}
    if entropy is not None:
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * agg_loss(
                entropy, response_mask, loss_agg_mode, loss_scale_factor, **norms
            )
        with torch.no_grad():
            metrics["actor/entropy"] = agg_loss(
                entropy.detach(), response_mask, loss_agg_mode, loss_scale_factor
            ).item()
    if use_kl_loss:
        kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
        loss = loss + kl_loss_coef * agg_loss(kld, response_mask, loss_agg_mode, loss_scale_factor, **norms)
        with torch.no_grad():
            metrics["actor/kl_loss"] = agg_loss(
                kld.detach(), response_mask, loss_agg_mode, loss_scale_factor
            ).item()
        metrics["actor/kl_coef"] = float(kl_loss_coef)
    return loss, metrics


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    kl_penalty_type: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL (``use_kl_in_reward``): rewards = scores - beta * kl(old_logp, ref) on valid tokens.

    token_level_scores: (B, T), or (B,) outcome scores (placed on the last valid token); old_log_prob,
    ref_log_prob, response_mask: (B, T) -> (token_level_rewards (B, T), metrics) with
    ``actor/reward_kl_penalty`` = batch mean of the per-sequence mean KL and
    ``actor/reward_kl_penalty_coeff`` = beta. Feed the rewards (B, T) to the advantage estimator.
    """
    with torch.no_grad():
        if token_level_scores.dim() == 1:
            token_level_scores = scores_to_token_rewards(token_level_scores, response_mask)
        mask = response_mask.to(old_log_prob.dtype)
        kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * mask
        rewards = token_level_scores - beta * kld
        per_seq = kld.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        metrics = {
            "actor/reward_kl_penalty": per_seq.mean().item(),
            "actor/reward_kl_penalty_coeff": float(beta),
        }
    return rewards, metrics


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
