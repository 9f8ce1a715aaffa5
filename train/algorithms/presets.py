"""Named algorithm presets: plain dicts of config overrides, applied on top of the defaults.

Keys are the keyword names of the functions in ``advantages.py``/``losses.py`` (plus ``adv_estimator``
and ``use_kl_in_reward``), so a trainer can route each to its call.
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

PRESETS: dict[str, dict[str, Any]] = {"grpo": GRPO, "dr_grpo": DR_GRPO}


def get_preset(name: str) -> dict[str, Any]:
    """A copy of preset ``name`` (callers may mutate it); ValueError listing the valid names otherwise."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid: {sorted(PRESETS)}") from None
