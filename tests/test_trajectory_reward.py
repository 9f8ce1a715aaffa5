"""The training reward of multi-turn rollouts: reward functions that read whole trajectories, and the
environment's rewards through env.reward_weight (train/rewards/trajectory.py)."""

from __future__ import annotations

import math

from train.batch import Batch
from train.rewards.base import RewardResult
from train.rewards.trajectory import score_rollout, takes_trajectories


def _rollout(episodes: list[dict] | None) -> Batch:
    n = len(episodes) if episodes else 2
    return Batch(
        prompt_ids=[[1]] * n,
        response_ids=[[2]] * n,
        response_logprobs=[[0.0]] * n,
        texts=[f"answer {i}" for i in range(n)],
        finish_reasons=["stop"] * n,
        group_index=[0] * n,
        episodes=episodes or [],
    )


def _episode(env_reward: float, calls: int, failed: str | None = None) -> dict:
    return {"env_reward": env_reward, "tool_calls": calls, "failed": failed, "segments": []}


class CallCounter:
    """Pays 1 for a trajectory that called exactly one tool: a reward only the whole trajectory can give."""

    def __call__(self, rows, responses, group_index, trajectories):
        return RewardResult(scores=[float(t["tool_calls"] == 1) for t in trajectories])


def plain(rows, responses, group_index):
    return RewardResult(scores=[0.5] * len(responses), correct=[1.0] * len(responses))


def test_which_reward_functions_receive_trajectories():
    assert takes_trajectories(CallCounter())
    assert takes_trajectories(lambda rows, responses, group_index, **kw: None)
    assert not takes_trajectories(plain)
    assert not takes_trajectories(len)  # a builtin: the plain call


def test_a_reward_function_reads_the_trajectory():
    rollout = _rollout([_episode(0.0, 1), _episode(0.0, 2), _episode(0.0, 0)])
    assert score_rollout(CallCounter(), [{}] * 3, rollout).scores == [1.0, 0.0, 0.0]


def test_environment_rewards_enter_through_the_declared_weight():
    rollout = _rollout(
        [_episode(1.0, 0), _episode(0.25, 0), _episode(float("nan"), 0), _episode(2.0, 0, "boom")]
    )
    logged_only = score_rollout(plain, [{}] * 4, rollout, 0.0)
    assert logged_only.scores == [0.5, 0.5, 0.5, 0.0]  # the failed trajectory scores 0 and is not correct
    assert logged_only.correct == [1.0, 1.0, 1.0, 0.0]
    weighted = score_rollout(plain, [{}] * 4, rollout, 2.0)
    assert weighted.scores == [2.5, 1.0, 0.5, 0.0]  # NaN from an environment adds nothing
    assert all(math.isfinite(s) for s in weighted.scores)


def test_single_turn_rollouts_are_scored_as_before():
    assert score_rollout(plain, [{}] * 2, _rollout(None), 3.0).scores == [0.5, 0.5]
