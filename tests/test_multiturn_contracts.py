"""The contracts of the algorithms on multi-turn trajectories (docs/agents.md, "Contracts on multi-turn
trajectories"), on hand-computed values: DAPO's overlong shaping counts the model's turns only, one turn at a
time, in the step plug-in and in dynamic sampling alike; REINFORCE++'s return flows across environment
segments, discounted over model tokens only."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tests.tensors import t
from train.algorithms.advantages import compute_reinforce_plus_plus_outcome_advantage
from train.algorithms.dapo import longest_model_turn, overlong_shaping, turn_overlong_penalty
from train.algorithms.registry import StepContext
from train.batch import Batch

MAX_NEW, BUFFER = 48, 16  # rollout.max_new_tokens, algorithm.overlong_buffer_len: the ramp starts at 32


def trajectory(*segments: int) -> list[int]:
    """The token mask of model and environment segments taking turns (model first): lengths in tokens."""
    return [m for k, n in enumerate(segments) for m in [1 - k % 2] * n]


# three 3-turn trajectories (turns of 30/30/30, 20/40/28 and 48/10 model tokens, 5 environment tokens between)
# and a single-turn response of 36 tokens
MASKS = [trajectory(30, 5, 30, 5, 30), trajectory(20, 5, 40, 5, 28), trajectory(48, 5, 10), trajectory(36)]


def batch_of(masks: list[list[int]], scores: list[float], groups: list[int]) -> Batch:
    """A multi-turn rollout's batch as the agent loop returns it, with its reward."""
    b = Batch(
        prompt_ids=[[1]] * len(masks), response_ids=[[7] * len(m) for m in masks],
        response_logprobs=[[0.0] * len(m) for m in masks], texts=[""] * len(masks),
        finish_reasons=["stop"] * len(masks), group_index=groups, token_mask=masks, scores=scores,
    )  # fmt: skip
    b["response_mask"] = b.padded(b.model_token_mask())
    return b


def test_overlong_shaping_takes_the_longest_model_turn():
    batch = batch_of(MASKS, [0.0] * 4, [0, 1, 2, 3])
    assert longest_model_turn(batch["response_mask"]).tolist() == [30, 40, 48, 36]
    batch["rewards"] = torch.zeros(4)
    cfg = SimpleNamespace(overlong_buffer_len=BUFFER, overlong_penalty_factor=1.0)
    figures = overlong_shaping(cfg, batch, StepContext(MAX_NEW))
    # longest turn 30 < 32: 0 (all 90 model tokens against 48 gave -(90 - 32) / 16 = -3.625); 40: -(40 - 32)
    # / 16 = -.5 (88 tokens gave -3.5); 48, a turn cut at the limit: -1, the single-turn floor (58 gave
    # -1.625); the single-turn 36: -(36 - 32) / 16 = -.25, as before
    assert batch["rewards"].tolist() == [0.0, -0.5, -1.0, -0.25]
    assert figures == {"train/overlong_penalty_mean": -0.4375, "train/overlong_penalised_share": 0.75}
    # never below the floor, whatever the factor
    assert turn_overlong_penalty(batch["response_mask"], MAX_NEW, BUFFER, 0.5).min().item() == -0.5


class _DynamicSampling:
    """The trainer state `GRPOTrainer._generate` reads, with a rollout that returns one hand-made batch (the
    engine's part; dynamic sampling's own code runs as in training)."""

    def __init__(self, batch: Batch) -> None:
        algorithm = SimpleNamespace(
            filter_groups=True, filter_groups_metric="seq_reward", max_num_gen_batches=1,
            overlong_buffer_len=BUFFER, overlong_penalty_factor=1.0,
        )  # fmt: skip
        self.cfg = SimpleNamespace(
            algorithm=algorithm, data=SimpleNamespace(prompts_per_step=1), rollout=SimpleNamespace(max_new_tokens=MAX_NEW)
        )  # fmt: skip
        self.world, self.extra_gen_batches, self.batch = 1, 0, batch

    def _rollout(self, step: int, gen_batch: int, per_rank: int, times: list[float]) -> Batch:
        return self.batch


def test_dynamic_sampling_counts_the_same_penalty():
    from train.stages.grpo import GRPOTrainer

    # group 0: turns 30/30/30 and 30/30 (90 and 60 model tokens, every turn under 32): one reward, a group
    # with nothing to teach, dropped; counting every response token (100 and 65) it looked varied, -4.25 vs
    # -2.06, and was kept in place of group 1: turns 20/40/28 and 48/10, penalties -.5 and -1, varied
    masks = [MASKS[0], trajectory(30, 5, 30), MASKS[1], MASKS[2]]
    stand_in = _DynamicSampling(batch_of(masks, [1.0] * 4, [0, 0, 1, 1]))
    kept, figures, _ = GRPOTrainer._generate(stand_in, 1)
    assert kept.token_mask == masks[2:]
    assert figures["train/dropped_groups"] == 1 and figures["train/generated_groups"] == 2


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, t(expected), atol=1e-6, rtol=0)


def test_reinforce_plus_plus_return_flows_across_environment_segments():
    # two 2-turn trajectories: model 2 tokens, environment 2, model 2; outcome 1 and 0
    mask = t([trajectory(2, 2, 2)] * 2)
    adv = compute_reinforce_plus_plus_outcome_advantage(t([1.0, 0.0]), None, mask)
    # gamma 1: returns 1 on all four model tokens of the first (its first turn too: resetting at the
    # environment gave it 0, the loser's value) and 0 on the second; mean .5, unbiased std over the 8 model
    # tokens sqrt(8 * .25 / 7) = .5345225 -> +-.9354143; environment tokens 0
    win, lose = 0.9354143, -0.9354143
    close(adv, [[win, win, 0, 0, win, win], [lose, lose, 0, 0, lose, lose]])
    # gamma .5 discounts over model tokens only: returns [.125, .25, -, -, .5, 1] (the environment tokens are
    # not steps); with the loser's 0s: mean 1.875 / 8 = .234375, sum of squared deviations 1.328125 - 8 *
    # .234375^2 = .888671875, std sqrt(.888671875 / 7) = .3563048
    adv = compute_reinforce_plus_plus_outcome_advantage(t([1.0, 0.0]), None, mask, gamma=0.5)
    lose = -0.6577935
    close(adv, [[-0.3069703, 0.0438529, 0, 0, 0.7454993, 2.1487921], [lose, lose, 0, 0, lose, lose]])
