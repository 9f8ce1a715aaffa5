"""KL coefficient control for the in-reward KL penalty: fixed, or adaptive toward a target KL.

The adaptive rule is Ziegler et al. 2019 (arXiv 1909.08593), as verl's ``AdaptiveKLController``:
e = clip(KL / target - 1, -0.2, 0.2); beta <- beta * (1 + e * n_steps / horizon), with n_steps the
number of responses in the batch that measured KL. Above the target beta grows, below it shrinks, by at
most 20% of n_steps / horizon per update. The coefficient is plain state (a float) so the trainer can
checkpoint it with the rest of its state.

Per-token KL in the reward itself is ``kl.apply_kl_in_reward`` (rewards_t = scores_t - beta * kl_t); the
step plug-in ``kl_in_reward`` applies it before the estimator and moves the coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass

from train.algorithms.kl import KL_PENALTIES, apply_kl_in_reward, kl_penalty
from train.algorithms.registry import Knob, register_step

__all__ = ["KL_CTRL_KNOBS", "KLController", "adaptive_kl_coef", "kl_in_reward"]


def adaptive_kl_coef(coef: float, current_kl: float, target_kl: float, horizon: int, n_steps: int) -> float:
    """The next in-reward KL coefficient after a batch of ``n_steps`` responses measured ``current_kl``."""
    if horizon <= 0:
        raise ValueError(
            f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive KL controller, got {horizon}"
        )
    if target_kl <= 0:
        raise ValueError(
            f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive KL controller, got {target_kl}"
        )
    error = min(max(current_kl / target_kl - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_steps / horizon)


@dataclass
class KLController:
    """The in-reward KL coefficient ``value``; ``kind`` = ``fixed`` (never changes) or ``adaptive``."""

    value: float
    kind: str = "fixed"
    target_kl: float = 0.1
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "adaptive"):
            raise ValueError(f"algorithm.kl_ctrl.type={self.kind!r} is unknown: use fixed or adaptive")
        if self.kind == "adaptive":
            adaptive_kl_coef(self.value, self.target_kl, self.target_kl, self.horizon, 0)  # validates

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move the coefficient after a batch (a no-op when fixed); returns the new value."""
        if self.kind == "adaptive":
            self.value = adaptive_kl_coef(self.value, current_kl, self.target_kl, self.horizon, n_steps)
        return self.value


KL_CTRL_KNOBS = {
    "kl_penalty": Knob(
        "kl",
        "KL estimator in the reward (use_kl_in_reward): kl|k1, abs, mse|k2, low_var_kl|k3 ('+': k2 gradient)",
        str,
        choices=tuple(KL_PENALTIES) + tuple(f"{k}+" for k in KL_PENALTIES),
    ),
}


# ---- step plug-in: KL in the reward ---------------------------------------------------------------
@register_step(
    "kl_in_reward",
    "before_estimator",
    enabled=lambda cfg: cfg.use_kl_in_reward,
    knobs=KL_CTRL_KNOBS,
    needs=("ref_log_probs",),
    state=lambda cfg: {"kl_coef": cfg.kl_ctrl.kl_coef},
)
def kl_in_reward(cfg, batch, ctx) -> dict[str, float]:
    """verl's apply_kl_penalty: ``batch["token_rewards"]`` = rewards at the last token - beta * kl at every
    token, ``batch["rewards"]`` their sum; KL to the reference from the trainer's old log-probs when the
    step computed them, else the rollout engine's. Then the controller moves beta for the next step."""
    old = batch.get("old_log_probs")
    old = old if old is not None else batch["rollout_log_probs"]
    mask, n = batch["response_mask"], len(batch)
    ctrl = KLController(ctx.state["kl_coef"], cfg.kl_ctrl.type, cfg.kl_ctrl.target_kl, cfg.kl_ctrl.horizon)
    token_rewards, metrics = apply_kl_in_reward(
        batch["rewards"], old, batch["ref_log_probs"], mask, ctrl.value, cfg.kl_penalty
    )
    batch["token_rewards"], batch["rewards"] = token_rewards, token_rewards.sum(-1)
    per_seq = kl_penalty(old, batch["ref_log_probs"], cfg.kl_penalty) * mask
    metrics["train/kl_in_reward"] = per_seq.sum(-1).mean().item()
    total = ctx.all_reduce_sum(n)
    ctx.state["kl_coef"] = ctrl.update(
        ctx.all_reduce_sum(metrics["actor/reward_kl_penalty"] * n) / total, int(total)
    )
    return metrics
