"""DAPO's data-side pieces (arXiv 2503.14476): dynamic sampling and overlong reward shaping.

DAPO = clip-higher (``clip_ratio_high`` > ``clip_ratio_low``) + token-level loss (``token-mean``) +
dynamic sampling + overlong shaping; the first two are existing knobs, the last two live here as pure
functions the trainer calls:

- dynamic sampling: a group whose responses all got the same reward has zero GRPO advantage and teaches
  nothing; drop it and keep generating until ``prompts_per_step`` informative groups are collected
  (:func:`filter_values`, :func:`varied_groups`, :func:`select_groups`, :func:`check_gen_batches`);
- overlong shaping: a linear penalty over the last ``buffer_len`` tokens before the length limit
  (:func:`overlong_penalty`), added to the score, so truncation is discouraged smoothly rather than by a
  cliff; the step plug-in ``overlong_shaping`` applies it after the reward, and dynamic sampling's
  ``seq_reward`` counts it, both through :func:`turn_overlong_penalty`.

Multi-turn trajectories (docs/agents.md, "Contracts on multi-turn trajectories"): the limit the ramp
approaches is ``rollout.max_new_tokens``, which cuts each model turn, so the penalty is that of the longest
model turn: environment tokens never count, a trajectory's penalty is never below a single turn's floor
(-``overlong_penalty_factor``), and a one-turn response is shaped exactly as before. The trajectory budget
(``env.max_total_tokens``) is not ramped against: it counts environment tokens too, and a ramp on the whole
trajectory would penalise calling tools (more turns) rather than running into the cut.

Dynamic sampling stays a sampling strategy of the trainer (``GRPOTrainer._generate``), not a step plug-in:
it decides how many generation batches a step draws, so it runs around generation and the reward, before
there is a batch to hand to a plug-in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from train.algorithms.advantages import _group_ids
from train.algorithms.registry import Knob, register_knobs, register_step

__all__ = [
    "DYNAMIC_SAMPLING_KNOBS",
    "FILTER_METRICS",
    "OVERLONG_KNOBS",
    "check_gen_batches",
    "filter_values",
    "overlong_penalty",
    "longest_model_turn",
    "select_groups",
    "turn_overlong_penalty",
    "varied_groups",
]


FILTER_METRICS = ("score", "acc", "seq_reward", "seq_final_reward")  # verl's DAPO recipe's names


def filter_values(
    metric: str,
    scores: Sequence[float] | torch.Tensor,
    correct: Sequence[float] | torch.Tensor | None = None,
    overlong: torch.Tensor | None = None,
    kl_in_reward: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B,) float64: the value dynamic sampling compares within a group (``filter_groups_metric``).

    ``score``: the reward's score (before any shaping); ``acc``: correctness (``correct`` (B,), needed);
    ``seq_reward``: the sequence's summed token-level score, i.e. score + DAPO's overlong penalty
    (``overlong`` (B,), None = off; verl: ``token_level_scores.sum(-1)``); ``seq_final_reward``: that minus
    the in-reward KL penalty beta * sum_t kl_t (``kl_in_reward`` (B,), None = no in-reward KL; verl:
    ``token_level_rewards.sum(-1)``).
    """
    if metric not in FILTER_METRICS:
        raise ValueError(
            f"algorithm.filter_groups_metric={metric!r} is unknown: use {' | '.join(FILTER_METRICS)}"
        )
    if metric == "acc":
        if correct is None:
            raise ValueError(
                "algorithm.filter_groups_metric=acc needs a reward that reports correctness; use score"
            )
        return torch.as_tensor(correct, dtype=torch.float64)
    value = torch.as_tensor(scores, dtype=torch.float64)
    if metric in ("seq_reward", "seq_final_reward") and overlong is not None:
        value = value + overlong.to(torch.float64)
    if metric == "seq_final_reward" and kl_in_reward is not None:
        value = value - kl_in_reward.to(torch.float64)
    return value


def varied_groups(metric: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """(B,) bool: True for responses whose group's ``metric`` values are not all equal.

    metric: (B,) the filtering value (the score, or the accuracy); group_index: (B,). A group of one is
    kept (verl keeps it: it may still carry a signal through other estimators). Equality is exact
    (max == min), so a group of identical non-binary rewards is dropped whatever their float rounding.
    """
    m = metric.to(torch.float64)
    ids, n_groups = _group_ids(group_index, m.shape[0])
    high = torch.full((n_groups,), float("-inf"), dtype=m.dtype).scatter_reduce(0, ids, m, reduce="amax")
    low = torch.full((n_groups,), float("inf"), dtype=m.dtype).scatter_reduce(0, ids, m, reduce="amin")
    size = torch.zeros(n_groups, dtype=m.dtype).scatter_add_(0, ids, torch.ones_like(m))
    return ((high > low) | (size == 1))[ids]


def select_groups(keep: torch.Tensor, group_index: torch.Tensor, max_groups: int) -> tuple[torch.Tensor, int]:
    """Rows of the first ``max_groups`` kept groups, in order of first appearance: (row indices, groups).

    keep: (B,) bool from :func:`varied_groups` over everything generated so far (batches concatenated);
    group_index: (B,). Returns the indices to train on (a LongTensor) and how many groups they hold (at
    most ``max_groups``; fewer means: generate another batch).
    """
    order: list[int] = []
    seen: set[int] = set()
    for value, k in zip(group_index.tolist(), keep.tolist()):
        if k and value not in seen:
            seen.add(value)
            order.append(value)
    chosen = set(order[:max_groups])
    rows = [i for i, value in enumerate(group_index.tolist()) if value in chosen]
    return torch.tensor(rows, dtype=torch.long), len(chosen)


def check_gen_batches(num_gen_batches: int, max_num_gen_batches: int, groups: int, wanted: int) -> bool:
    """Whether to generate another batch: True while ``groups < wanted`` and under the cap.

    ``max_num_gen_batches`` <= 0 means no cap. At the cap with too few groups this raises one line naming
    the knob (verl raises too): the prompts are too hard or too easy for the current policy.
    """
    if groups >= wanted:
        return False
    if max_num_gen_batches <= 0 or num_gen_batches < max_num_gen_batches:
        return True
    raise RuntimeError(
        f"dynamic sampling: {num_gen_batches} generation batches gave {groups} of {wanted} groups with varied "
        "rewards; raise algorithm.max_num_gen_batches (0 = no cap) or use easier/harder prompts"
    )


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment, to add to each response's score. (B,) -> (B,) float.

    With L_exp = max_response_length - buffer_len: 0 up to L_exp tokens, then -(len - L_exp) / buffer_len *
    penalty_factor, reaching -penalty_factor at the limit (linear, never positive, never below
    -penalty_factor: a length past the limit cannot be a worse truncation than the limit itself).
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"algorithm.overlong_buffer_len={buffer_len} must be in (0, max response length "
            f"{max_response_length}]"
        )
    expected = max_response_length - buffer_len
    excess = response_lengths.to(torch.float32) - expected
    return torch.clamp(-excess / buffer_len * penalty_factor, min=-penalty_factor, max=0.0)


def longest_model_turn(model_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1 on model tokens, 0 on environment tokens and padding -> (B,) long: each row's longest run of
    model tokens, i.e. its longest model turn (a single-turn response: its length)."""
    m = model_mask.to(torch.long)
    seen = m.cumsum(-1)  # model tokens up to and including t
    at_last_gap = torch.where(m == 0, seen, torch.zeros_like(seen)).cummax(-1).values
    return (seen - at_last_gap).amax(-1) if m.shape[-1] else m.sum(-1)


def turn_overlong_penalty(
    model_mask: torch.Tensor, max_new_tokens: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """The overlong penalty (B,) of single- and multi-turn responses alike: :func:`overlong_penalty` of the
    longest model turn (:func:`longest_model_turn`) against ``max_new_tokens``, the limit that cuts a turn.
    model_mask: (B, T) 1 on model tokens (the response mask of a multi-turn batch)."""
    return overlong_penalty(longest_model_turn(model_mask), max_new_tokens, buffer_len, penalty_factor)


DYNAMIC_SAMPLING_KNOBS = {
    "filter_groups": Knob(False, "DAPO dynamic sampling: drop groups whose rewards are all equal, refill"),
    "filter_groups_metric": Knob("score", "value compared within a group: score | acc | seq_reward (score + overlong penalty) | seq_final_reward (seq_reward - in-reward KL)", str, choices=FILTER_METRICS),
    "max_num_gen_batches": Knob(10, "dynamic sampling: generation batches per step before giving up (0 = no cap)", int, valid=lambda n: n >= 0, rule=">= 0"),
}  # fmt: skip
register_knobs("dynamic_sampling", DYNAMIC_SAMPLING_KNOBS, select_groups)

# ---- step plug-in: overlong shaping ---------------------------------------------------------------
OVERLONG_KNOBS = {
    "overlong_buffer_len": Knob(0, "DAPO overlong shaping: penalty ramp length in tokens (0 = off; verl's enable=false, as a zero-length ramp is undefined)", int, valid=lambda n: n >= 0, rule=">= 0"),
    "overlong_penalty_factor": Knob(1.0, "DAPO overlong shaping: penalty at the length limit", float, valid=lambda f: f >= 0, rule=">= 0"),
}  # fmt: skip


def _overlong_fits(cfg, run) -> str | None:
    if cfg.overlong_buffer_len > run.rollout.max_new_tokens:
        return (
            f"algorithm.overlong_buffer_len={cfg.overlong_buffer_len} must be <= rollout.max_new_tokens="
            f"{run.rollout.max_new_tokens} (the penalty ramps up to the length limit)"
        )
    return None


@register_step(
    "overlong_shaping",
    "after_reward",
    enabled=lambda cfg: cfg.overlong_buffer_len > 0,
    knobs=OVERLONG_KNOBS,
    check=_overlong_fits,
)
def overlong_shaping(cfg, batch, ctx) -> dict[str, float]:
    """Add :func:`turn_overlong_penalty` to ``batch["rewards"]`` (B,)."""
    penalty = turn_overlong_penalty(
        batch["response_mask"],
        ctx.max_new_tokens,
        cfg.overlong_buffer_len,
        cfg.overlong_penalty_factor,
    )
    batch["rewards"] = batch["rewards"] + penalty
    return {
        "train/overlong_penalty_mean": float(penalty.mean()),
        "train/overlong_penalised_share": float((penalty < 0).float().mean()),
    }
