"""The training reward of a multi-turn rollout: what the reward function says of each whole trajectory, plus
what the environment and the tools paid along the way, through one declared combination.

    score_i = reward_fn(...)_i + env.reward_weight * env_reward_i        (0 when the trajectory failed)

`env_reward_i` is the sum of the trajectory's `EnvStep.reward`s and of the rewards its tools returned
(`ToolResult.reward`, train/env/base.py). `env.reward_weight=0` (the default) logs them (`env/reward_mean`)
and trains on the reward function alone; 1 adds them as they are. A reward function that declares a
`trajectories` parameter receives each sample's trajectory (its turns, calls and results: the agent loop's
`Trajectory.summary()`), as verl's `compute_score(..., extra_info)` and TRL's reward functions with
`environments` do; one that does not is called as on single-turn rollouts, on each trajectory's last model turn.
"""

from __future__ import annotations

import inspect
from typing import Any

from train.env.base import finite_or_zero
from train.rewards.base import RewardResult


def takes_trajectories(reward_fn: Any) -> bool:
    """Whether `reward_fn(rows, responses, group_index, trajectories=...)` is how it wants to be called."""
    try:
        parameters = inspect.signature(reward_fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: the plain call
        return False
    return "trajectories" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def score_rollout(
    reward_fn: Any, rows: list[dict], rollout: Any, env_reward_weight: float = 0.0
) -> RewardResult:
    """The reward of every sample of `rollout` (a Batch; `episodes` set when it is multi-turn)."""
    episodes = rollout.episodes or None
    extra = {"trajectories": episodes} if episodes and takes_trajectories(reward_fn) else {}
    result = reward_fn(rows, rollout.texts, rollout.group_index, **extra)
    if not episodes:
        return result
    if env_reward_weight:
        result.scores = [
            s + env_reward_weight * finite_or_zero(e.get("env_reward", 0.0))
            for s, e in zip(result.scores, episodes)
        ]
    for i, episode in enumerate(episodes):  # a trajectory whose environment failed scores 0, not correct
        if episode.get("failed"):
            result.scores[i] = 0.0
            if result.correct is not None:
                result.correct[i] = 0.0
    return result
