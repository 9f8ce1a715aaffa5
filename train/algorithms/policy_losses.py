"""Policy-loss modes beside PPO's clipped surrogate: GSPO, Clip-Cov, KL-Cov, CISPO, GPG, SAPO.

Each returns the *per-token* loss (B, T) and its metrics (unprefixed keys; the actor adds ``actor/``);
``losses.agg_loss`` turns it into a scalar with the configured ``loss_agg_mode``, as for the default
(``vanilla``: PPO clip + dual clip in ``losses.py``). Rollout-correction weights, when on, multiply the
per-token loss after this (``rollout_correction.py``), whatever the mode. Semantics follow verl's
``core_algos`` loss modes of the same names; ``docs/algorithms-verl.md`` lists where they differ.

Shapes: old_log_prob, log_prob, advantages, response_mask all (B, T); ``log_prob`` carries the gradient.
"""

from __future__ import annotations

import torch

from train.algorithms.actor_loss import CLIP_KNOBS
from train.algorithms.aggregation import masked_mean
from train.algorithms.registry import Knob, policy_loss_from

__all__ = [
    "POLICY_LOSS_KNOBS",
    "cispo_loss",
    "clip_cov_loss",
    "gpg_loss",
    "gspo_loss",
    "kl_cov_loss",
    "sapo_loss",
]

Metrics = dict[str, float]


def _ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-ratio clamped to +-20, ratio): the clamp keeps exp finite when the policies drift apart."""
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    return log_ratio, torch.exp(log_ratio)


def _ppo_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> float:
    return masked_mean((old_log_prob - log_prob).detach().float(), response_mask).item()


def gspo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (arXiv 2507.18071): one importance ratio per sequence, the geometric mean of its token ratios.

    s_i = exp(mean_t (logp - old_logp)) over the valid tokens; every token of sequence i uses
    s_i,t = sg(s_i) * pi(y_t) / sg(pi(y_t)), equal to s_i in value, whose gradient is the token's own
    log-prob gradient times s_i. Loss = max(-A s, -A clip(s, 1 - low, 1 + high)); log s clamped at 10.
    The paper (and verl, which forces it) aggregates with ``seq-mean-token-mean``; pick that mode.
    Metrics: ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` (always 0: no dual clip).
    """
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = ((log_prob - old_log_prob) * mask).sum(dim=-1) / lengths
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask).item(),
        "ppo_kl": _ppo_kl(old_log_prob, log_prob, response_mask),
        "pg_clipfrac_lower": 0.0,
    }
    return torch.maximum(unclipped, clipped), metrics


def clip_cov_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov (arXiv 2505.22617): PPO clip, plus no gradient through a few high-covariance tokens.

    cov_t = (A_t - mean A) * (logp_t - mean logp) over the batch's valid tokens. Among the valid tokens
    the PPO clip left alone with clip_cov_lb < cov_t < clip_cov_ub, max(1, int(clip_cov_ratio * N_valid))
    are drawn at random (``torch.randperm``, ``generator`` or the global RNG) and their loss is zeroed:
    the tokens that drive entropy collapse stop pushing. No ratio clamp and no dual clip (as verl).
    Metrics: ``pg_clipfrac`` = share of valid tokens zeroed, ``ppo_kl``.
    """
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    valid = response_mask.bool()
    with torch.no_grad():
        centred_adv = advantages - masked_mean(advantages, valid)
        centred_logp = log_prob.detach() - masked_mean(log_prob.detach(), valid)
        cov = centred_adv * centred_logp
        candidate = valid & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        positions = torch.nonzero(candidate)
        n_clip = max(int(clip_cov_ratio * valid.sum().item()), 1)
        if len(positions) > 0:
            positions = positions[torch.randperm(len(positions), generator=generator)[:n_clip]]
        keep = torch.ones_like(advantages)
        keep[positions[:, 0], positions[:, 1]] = 0
    metrics = {
        "pg_clipfrac": masked_mean((keep == 0).float(), valid).item(),
        "ppo_kl": _ppo_kl(old_log_prob, log_prob, response_mask),
    }
    return torch.maximum(unclipped, clipped) * keep, metrics


def kl_cov_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov (arXiv 2505.22617): unclipped -A * ratio, plus a |logp - old_logp| penalty on the
    max(1, int(kl_cov_ratio * N_valid)) valid tokens of largest covariance (A - mean A)(logp - mean logp).

    Metrics: ``ppo_kl``, ``kl_cov_frac`` (share of valid tokens penalised).
    """
    ratio = torch.exp(log_prob - old_log_prob)
    plain = -advantages * ratio
    penalised = plain + ppo_kl_coef * (log_prob - old_log_prob).abs()
    valid = response_mask.bool()
    with torch.no_grad():
        flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        chosen = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if len(flat_valid) > 0:
            adv = advantages.detach().reshape(-1)[flat_valid]
            logp = log_prob.detach().reshape(-1)[flat_valid]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            n_pick = max(1, int(len(flat_valid) * kl_cov_ratio))
            chosen[flat_valid[torch.topk(cov, n_pick).indices]] = True
        chosen = chosen.reshape(valid.shape)
    metrics = {
        "ppo_kl": _ppo_kl(old_log_prob, log_prob, response_mask),
        "kl_cov_frac": masked_mean(chosen.float(), valid).item(),
    }
    return torch.where(chosen, penalised, plain), metrics


def cispo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

    L = -sg(clip(ratio, 1 - low, 1 + high)) * A * logp: every token keeps a gradient (REINFORCE with a
    truncated, stop-gradient IS weight), unlike PPO where clipped tokens get none.
    Metrics: ``pg_clipfrac`` (share of tokens whose weight was clipped), ``ppo_kl``, ``pg_clipfrac_lower`` 0.
    """
    _, ratio = _ratio(old_log_prob, log_prob)
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    metrics = {
        "pg_clipfrac": masked_mean((ratio != weight).float(), response_mask).item(),
        "ppo_kl": _ppo_kl(old_log_prob, log_prob, response_mask),
        "pg_clipfrac_lower": 0.0,
    }
    return -weight * advantages * log_prob, metrics


def gpg_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, Metrics]:
    """GPG (arXiv 2504.02546): plain policy gradient L = -A * logp, no ratio and no clip (one update
    per rollout is on-policy). Pair with ``adv_estimator=gpg``. Metrics: ``ppo_kl``."""
    return -log_prob * advantages, {"ppo_kl": _ppo_kl(old_log_prob, log_prob, response_mask)}


def sapo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO (arXiv 2511.20347): a smooth gate instead of a hard clip.

    L = -f(ratio) * A with f(r) = sigmoid(tau (r - 1)) * 4 / tau (slope 1 at r = 1, flattening away from it);
    tau = tau_pos where A > 0, tau_neg otherwise. verl aggregates it with ``seq-mean-token-mean``.
    Metrics: ``ppo_kl``.
    """
    _, ratio = _ratio(old_log_prob, log_prob)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=advantages.dtype),
        torch.as_tensor(tau_neg, dtype=advantages.dtype),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {"ppo_kl": _ppo_kl(old_log_prob, log_prob, response_mask)}


# ---- method-table adapters: fn(old_log_prob, log_prob, advantages, response_mask, cfg, extras) -----------
POLICY_LOSS_KNOBS: dict[str, dict[str, Knob]] = {
    "gspo": CLIP_KNOBS,
    "clip_cov": {
        **CLIP_KNOBS,
        "clip_cov_ratio": Knob(0.0002, "Clip-Cov: share of valid tokens whose gradient is cut"),
        "clip_cov_lb": Knob(1.0, "Clip-Cov: lower bound of the covariance of a cut token"),
        "clip_cov_ub": Knob(5.0, "Clip-Cov: upper bound of the covariance of a cut token"),
    },
    "kl_cov": {
        "kl_cov_ratio": Knob(0.0002, "KL-Cov: share of valid tokens given the KL penalty"),
        "ppo_kl_coef": Knob(0.1, "KL-Cov: coefficient of |logp - old_logp| on those tokens"),
    },
    "cispo": CLIP_KNOBS,
    "gpg": {},
    "sapo": {
        "tau_pos": Knob(1.0, "SAPO gate temperature for positive advantages"),
        "tau_neg": Knob(1.05, "SAPO gate temperature for non-positive advantages"),
    },
}


gspo_entry = policy_loss_from("gspo", gspo_loss, POLICY_LOSS_KNOBS["gspo"])
clip_cov_entry = policy_loss_from("clip_cov", clip_cov_loss, POLICY_LOSS_KNOBS["clip_cov"])
kl_cov_entry = policy_loss_from("kl_cov", kl_cov_loss, POLICY_LOSS_KNOBS["kl_cov"])
cispo_entry = policy_loss_from("cispo", cispo_loss, POLICY_LOSS_KNOBS["cispo"])
gpg_entry = policy_loss_from("gpg", gpg_loss, POLICY_LOSS_KNOBS["gpg"])
sapo_entry = policy_loss_from("sapo", sapo_loss, POLICY_LOSS_KNOBS["sapo"])
