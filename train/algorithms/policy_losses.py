"""Policy-loss modes beside PPO's clipped surrogate: GSPO, Clip-Cov, KL-Cov, CISPO, GPG, SAPO, GMPO
(``geo_mean``) and rollout correction's bypass mode (``bypass_mode``).

Each returns the *per-token* loss (B, T) and its metrics (unprefixed keys; the actor adds ``actor/``);
``losses.agg_loss`` turns it into a scalar with the configured ``loss_agg_mode``, as for the default
(``vanilla``: PPO clip + dual clip in ``losses.py``). Rollout-correction weights, when on, multiply the
per-token loss after this (``rollout_correction.py``), except in ``geo_mean``, which takes their
per-sequence geometric mean itself (``applies_is_weights``). Semantics follow verl's
``core_algos`` loss modes of the same names; ``docs/algorithms-verl.md`` lists where they differ.

Shapes: old_log_prob, log_prob, advantages, response_mask all (B, T); ``log_prob`` carries the gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from train.algorithms.actor_loss import CLIP_KNOBS, _ppo_terms
from train.algorithms.aggregation import masked_mean
from train.algorithms.registry import Knob, policy_loss_from, register_policy_loss
from train.algorithms.rollout_correction import rollout_correction
from train.algorithms.surrogate import Metrics, clip_metrics, clipped_surrogate, log_ratio, ppo_kl

__all__ = [
    "BYPASS_LOSS_TYPES",
    "POLICY_LOSS_KNOBS",
    "bypass_mode_loss",
    "cispo_loss",
    "clip_cov_loss",
    "geo_mean_loss",
    "gpg_loss",
    "gspo_loss",
    "kl_cov_loss",
    "sapo_loss",
]


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
    surrogate = clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high)
    raw_log_ratio = log_ratio(old_log_prob, log_prob, bound=None)
    return surrogate.loss, clip_metrics(surrogate.clip_mask(), raw_log_ratio, response_mask)


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
    raw_log_ratio = log_ratio(old_log_prob, log_prob, bound=None)
    surrogate = clipped_surrogate(advantages, torch.exp(raw_log_ratio), clip_ratio_low, clip_ratio_high)
    valid = response_mask.bool()
    with torch.no_grad():
        centred_adv = advantages - masked_mean(advantages, valid)
        centred_logp = log_prob.detach() - masked_mean(log_prob.detach(), valid)
        cov = centred_adv * centred_logp
        candidate = valid & ~surrogate.clip_mask() & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        positions = torch.nonzero(candidate)
        n_clip = max(int(clip_cov_ratio * valid.sum().item()), 1)
        if len(positions) > 0:
            positions = positions[torch.randperm(len(positions), generator=generator)[:n_clip]]
        keep = torch.ones_like(advantages)
        keep[positions[:, 0], positions[:, 1]] = 0
    metrics = {
        "pg_clipfrac": masked_mean((keep == 0).float(), valid).item(),
        "ppo_kl": ppo_kl(raw_log_ratio, response_mask),
    }
    return surrogate.loss * keep, metrics


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
    raw_log_ratio = log_ratio(old_log_prob, log_prob, bound=None)
    plain = -advantages * torch.exp(raw_log_ratio)
    penalised = plain + ppo_kl_coef * raw_log_ratio.abs()
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
        "ppo_kl": ppo_kl(raw_log_ratio, response_mask),
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
    Metrics: ``pg_clipfrac`` (share of tokens whose weight was clipped), ``ppo_kl`` (of the log-ratio
    clamped to +-20, as verl), ``pg_clipfrac_lower`` 0.
    """
    log_r = log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_r)
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    return -weight * advantages * log_prob, clip_metrics(ratio != weight, log_r, response_mask)


def gpg_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, Metrics]:
    """GPG (arXiv 2504.02546): plain policy gradient L = -A * logp, no ratio and no clip (one update
    per rollout is on-policy). Pair with ``adv_estimator=gpg``. Metrics: ``ppo_kl``."""
    return -log_prob * advantages, {"ppo_kl": ppo_kl(log_ratio(old_log_prob, log_prob, None), response_mask)}


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
    Metrics: ``ppo_kl`` (of the log-ratio clamped to +-20, as verl).
    """
    log_r = log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_r)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=advantages.dtype),
        torch.as_tensor(tau_neg, dtype=advantages.dtype),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {"ppo_kl": ppo_kl(log_r, response_mask)}


def geo_mean_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GMPO (arXiv 2507.20673, verl ``geo_mean``): PPO on the geometric mean of the token ratios.

    With d_t = logp - old_logp (not clamped) and s = sign(A_t): d'_t = s * min(s d_t, s clamp(d_t, -low,
    high)) (clip at token level, in log space); per sequence r_i = exp(mean_t d'_t), A_i = mean_t A_t and
    L_i = -A_i r_i, times the geometric mean of the rollout-correction weights exp(mean_t log(w_t + 1e-10))
    when ``is_weights`` (B, T) is given. Returns L_i on every valid token of sequence i (0 on padding):
    ``seq-mean-token-mean`` gives verl's mean over sequences (verl ignores ``loss_agg_mode``; set it).
    Metrics: ``pg_clipfrac`` / ``pg_clipfrac_lower``: share of valid tokens whose d_t was clipped with
    A > 0 / A < 0; ``ppo_kl`` (raw log-ratio, as verl).
    """
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(dim=-1).clamp(min=1)
    log_r = log_ratio(old_log_prob, log_prob, bound=None)
    sign = torch.sign(advantages)
    clipped = torch.clamp(log_r, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_r, sign * clipped)
    ratio = torch.exp((pessimistic * mask).sum(dim=-1) / lengths)
    seq_advantage = (advantages * mask).sum(dim=-1) / lengths
    seq_loss = -seq_advantage * ratio
    if is_weights is not None:
        log_w = torch.where(mask.bool(), torch.log(is_weights.detach() + 1e-10), torch.zeros_like(mask))
        seq_loss = seq_loss * torch.exp(log_w.sum(dim=-1) / lengths)
    was_clipped = (log_r != clipped).detach()
    metrics = clip_metrics(
        was_clipped & (advantages > 0), log_r, response_mask, was_clipped & (advantages < 0)
    )
    return seq_loss.unsqueeze(-1) * mask, metrics


BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def bypass_mode_loss(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: Any,
) -> tuple[torch.Tensor, Metrics]:
    """Rollout correction's bypass mode (verl ``bypass_mode``): the rollout engine's log-probs are the
    old log-probs (no trainer forward for them), and IS weights and rejection are computed inside the loss
    on pi_current / pi_rollout, detached, by :func:`rollout_correction.rollout_correction` (``cfg``: the
    algorithm config, its ``rollout_is*`` / ``rollout_rs*`` knobs, ``loss_type``, the clip knobs).

    ``loss_type=ppo_clip``: PPO clip + dual clip with old = rollout (the ratio already is the IS ratio: no
    weights applied, as verl); ``reinforce``: L = -w * A * logp (w the truncated IS weights, 1 when
    ``rollout_is`` is null). Rejected tokens get loss 0 (they still count in the mini-batch's normaliser:
    the rejection is known only after this forward). All tensors (B, T). Metrics: the loss's
    (``ppo_kl`` of the loss's mask; for ppo_clip also the clip fractions) and ``rollout_corr/*``.
    """
    loss_mask, weights, metrics = rollout_correction(log_prob.detach(), rollout_log_prob, response_mask, cfg)
    if cfg.loss_type == "ppo_clip":
        per_token, loss_metrics = _ppo_terms(
            rollout_log_prob,
            log_prob,
            advantages,
            loss_mask,
            cfg.clip_ratio_low,
            cfg.clip_ratio_high,
            cfg.clip_ratio_c,
        )
    elif cfg.loss_type == "reinforce":
        per_token = -advantages * log_prob * (1.0 if weights is None else weights)
        loss_metrics = {"ppo_kl": ppo_kl(log_ratio(rollout_log_prob, log_prob, None), loss_mask)}
    else:
        raise ValueError(
            f"algorithm.loss_type={cfg.loss_type!r} is unknown: use {' or '.join(BYPASS_LOSS_TYPES)}"
        )
    return per_token * loss_mask.to(per_token.dtype), {**loss_metrics, **metrics}


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
    "geo_mean": CLIP_KNOBS,
    "bypass_mode": {
        **CLIP_KNOBS,
        "loss_type": Knob("ppo_clip", "bypass_mode: ppo_clip (PPO with old = rollout log-probs) | reinforce (-w A logp with the rollout_is weights)", str, choices=BYPASS_LOSS_TYPES),
    },
}  # fmt: skip


gspo_entry = policy_loss_from("gspo", gspo_loss, POLICY_LOSS_KNOBS["gspo"])
clip_cov_entry = policy_loss_from("clip_cov", clip_cov_loss, POLICY_LOSS_KNOBS["clip_cov"])
kl_cov_entry = policy_loss_from("kl_cov", kl_cov_loss, POLICY_LOSS_KNOBS["kl_cov"])
cispo_entry = policy_loss_from("cispo", cispo_loss, POLICY_LOSS_KNOBS["cispo"])
gpg_entry = policy_loss_from("gpg", gpg_loss, POLICY_LOSS_KNOBS["gpg"])
sapo_entry = policy_loss_from("sapo", sapo_loss, POLICY_LOSS_KNOBS["sapo"])
geo_mean_entry = policy_loss_from(
    "geo_mean", geo_mean_loss, POLICY_LOSS_KNOBS["geo_mean"], applies_is_weights=True
)


@register_policy_loss("bypass_mode", knobs=POLICY_LOSS_KNOBS["bypass_mode"])
def bypass_mode_entry(old_log_prob, log_prob, advantages, response_mask, cfg, extras: dict | None = None):
    """``algorithm.policy_loss_mode=bypass_mode``: :func:`bypass_mode_loss`; the trainer passes the rollout
    engine's log-probs as ``old_log_prob`` and computes no step-level rollout correction."""
    return bypass_mode_loss(old_log_prob, log_prob, advantages, response_mask, cfg)
