"""Named algorithm presets: plain dicts of config overrides, applied on top of the defaults.

Keys are ``algorithm.*`` config keys (`python -m train preset=NAME` puts them under ``algorithm``).
"""

from __future__ import annotations

from typing import Any

# verl's GRPO defaults (docs/algorithms.md section 1): std-normalised advantages, token-mean loss, no KL.
GRPO: dict[str, Any] = {
    "adv_estimator": "grpo",
    "norm_adv_by_std_in_grpo": True,
    "loss_agg_mode": "token-mean",
    "use_kl_loss": False,
    "use_kl_in_reward": False,
}

# Dr.GRPO (arXiv 2503.20783): no std normalisation, constant-normalised token sums (no length bias), no KL.
DR_GRPO: dict[str, Any] = {
    "adv_estimator": "grpo",
    "norm_adv_by_std_in_grpo": False,
    "loss_agg_mode": "seq-mean-token-sum-norm",
    "use_kl_loss": False,
    "use_kl_in_reward": False,
}

# GSPO (arXiv 2507.18071): sequence-level ratio, aggregated seq-mean-token-mean (verl forces that mode for
# gspo; here it is the preset's), with the paper's (and verl's GSPO recipe's) tiny clip range.
GSPO: dict[str, Any] = {
    "policy_loss_mode": "gspo",
    "loss_agg_mode": "seq-mean-token-mean",
    "clip_ratio_low": 3e-4,
    "clip_ratio_high": 4e-4,
}

# SAPO (arXiv 2511.20347): the smooth gate, seq-mean-token-mean as verl forces it.
SAPO: dict[str, Any] = {"policy_loss_mode": "sapo", "loss_agg_mode": "seq-mean-token-mean"}

# CS336 assignment 5 (train/algorithms/cs336.py): its three policy-gradient losses exactly as the course
# defines them -- per-sequence token mean, then the mean over sequences; no KL, no entropy bonus; GRPO-Clip
# is the textbook clip (no dual clip); group-normalised rewards (r - mean) / (std + 1e-6), unbiased std.
_CS336_COMMON: dict[str, Any] = {
    "loss_agg_mode": "seq-mean-token-mean",
    "use_kl_loss": False,
    "use_kl_in_reward": False,
    "entropy_coeff": 0.0,
}
CS336_NO_BASELINE: dict[str, Any] = {
    **_CS336_COMMON,
    "adv_estimator": "no_baseline",
    "policy_loss_mode": "gpg",
}
CS336_REINFORCE_WITH_BASELINE: dict[str, Any] = {
    **_CS336_COMMON,
    "adv_estimator": "grpo",
    "norm_adv_by_std_in_grpo": True,
    "policy_loss_mode": "gpg",
}
CS336_GRPO_CLIP: dict[str, Any] = {
    **_CS336_COMMON,
    "adv_estimator": "grpo",
    "norm_adv_by_std_in_grpo": True,
    "policy_loss_mode": "vanilla",
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "clip_ratio_c": float("inf"),
}

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": GRPO,
    "dr_grpo": DR_GRPO,
    "gspo": GSPO,
    "sapo": SAPO,
    "cs336": CS336_GRPO_CLIP,  # the course's GRPO-Clip
    "cs336_grpo_clip": CS336_GRPO_CLIP,
    "cs336_reinforce_with_baseline": CS336_REINFORCE_WITH_BASELINE,
    "cs336_no_baseline": CS336_NO_BASELINE,
}


def get_preset(name: str) -> dict[str, Any]:
    """A copy of preset ``name`` (callers may mutate it); ValueError listing the valid names otherwise."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid: {sorted(PRESETS)}") from None
