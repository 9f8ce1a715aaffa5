"""REINFORCE++-baseline, OPO, GPG and GRPO pass@k on hand-computed tensors (arithmetic in the comments),
and the per-token KL-in-reward semantics the trainer must follow (issue 15, difference 1)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from train.algorithms.advantages import (
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
)
from train.algorithms.group_estimators import (
    compute_gpg_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    gpg_entry,
    grpo_passk_entry,
    opo_entry,
    reinforce_plus_plus_baseline_entry,
)
from train.algorithms.kl import apply_kl_in_reward

D = torch.float64

# Six responses in three groups (ids unsorted, non-contiguous), lengths 3, 1, 2, 3, 1, 3.
SCORES = torch.tensor([1.0, 0.0, 2.0, 4.0, 6.0, 5.0], dtype=D)
GROUPS = torch.tensor([7, 7, 3, 3, 3, 9])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=D)


def per_response(values):
    """(B,) values broadcast over each row's valid tokens."""
    return torch.tensor(values, dtype=D).unsqueeze(-1) * MASK


def test_reinforce_plus_plus_baseline_by_hand():
    # centred: group 7 mean .5 -> [.5, -.5]; group 3 mean 4 -> [-2, 0, 2]; group 9 alone keeps 5.
    # tokens: .5 x3, -.5, -2 x2, 0 x3, 2, 5 x3 = 13 valid; mean 14/13 = 1.0769231; squared deviations sum
    # 88 - 13 * 1.0769231^2 = 72.923077, unbiased var / 12 = 6.0769231, std 2.4651416
    # -> (.5 - 1.0769231) / 2.4651416 = -.2340324, ... (each row's one value on its valid tokens)
    adv = compute_reinforce_plus_plus_baseline_outcome_advantage(SCORES, GROUPS, MASK)
    want = per_response([-0.2340324, -0.6396886, -1.2481730, -0.4368605, 0.3744519, 1.5914205])
    torch.testing.assert_close(adv, want, atol=1e-6, rtol=0)
    assert float((adv * MASK).sum()) == pytest.approx(0.0, abs=1e-9)  # whitened: zero mean over tokens


def test_opo_length_weighted_baseline_by_hand():
    # group 7: lengths 3, 1 -> b = (3*1 + 1*0) / 4 = .75 -> [.25, -.75]
    # group 3: lengths 2, 3, 1 -> b = (2*2 + 3*4 + 1*6) / 6 = 22/6 -> [-1.6666667, .3333333, 2.3333333]
    # group 9 alone: baseline 0 -> 5
    adv = compute_opo_outcome_advantage(SCORES, GROUPS, MASK)
    want = per_response([0.25, -0.75, -5 / 3, 1 / 3, 7 / 3, 5.0])
    torch.testing.assert_close(adv, want, atol=1e-9, rtol=0)
    # every response of a group empty: baseline 0, not NaN
    empty = compute_opo_outcome_advantage(torch.tensor([1.0, 3.0], dtype=D), GROUPS[:2], torch.zeros(2, 2))
    assert torch.equal(empty, torch.zeros(2, 2, dtype=D))


def test_gpg_alpha_rescales_by_share_of_nonzero_rewards():
    # 5 of 6 scores are non-zero: alpha = 6/5 = 1.2; A = 1.2 * (s - group mean) (group of one: mean 0)
    adv = compute_gpg_outcome_advantage(SCORES, GROUPS, MASK)
    torch.testing.assert_close(adv, per_response([0.6, -0.6, -2.4, 0.0, 2.4, 6.0]), atol=1e-9, rtol=0)
    halved = compute_gpg_outcome_advantage(SCORES, GROUPS, MASK, f_norm=2.0)
    torch.testing.assert_close(halved, adv / 2)
    # all zero: alpha = 6 / max(0, 1); every advantage 0
    assert torch.equal(compute_gpg_outcome_advantage(SCORES * 0, GROUPS, MASK), torch.zeros(6, 3, dtype=D))


def test_grpo_passk_only_the_best_of_each_group_learns():
    s, g, m = SCORES[:5], GROUPS[:5], MASK[:5]
    # group 7 = [1, 0]: best row 0, margin 1, std .7071068 -> 1 / .7071078 = 1.4142116
    # group 3 = [2, 4, 6]: best row 4, margin 6 - 4 = 2, std 2 -> 2 / 2.000001 = .9999995
    adv = compute_grpo_passk_outcome_advantage(s, g, m)
    want = torch.tensor([1.4142116, 0, 0, 0, 0.9999995], dtype=D).unsqueeze(-1) * m
    torch.testing.assert_close(adv, want, atol=1e-6, rtol=0)
    raw = compute_grpo_passk_outcome_advantage(s, g, m, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(raw, torch.tensor([1.0, 0, 0, 0, 2.0], dtype=D).unsqueeze(-1) * m)
    # a tie for the best (binary rewards, two correct): the margin is 0, nobody learns
    tied = compute_grpo_passk_outcome_advantage(
        torch.tensor([1.0, 1.0, 0.0]), torch.zeros(3), torch.ones(3, 2)
    )
    assert torch.equal(tied, torch.zeros(3, 2))
    with pytest.raises(ValueError, match="grpo_passk needs at least 2 responses per prompt; set rollout.n"):
        compute_grpo_passk_outcome_advantage(SCORES, GROUPS, MASK)  # group 9 has one response


def test_token_level_rewards_are_summed():
    # (B, T) token rewards: the group estimators see each row's masked sum
    token = torch.zeros(6, 3, dtype=D)
    token[:, 0] = SCORES / 2
    token[:, 0] += SCORES / 2
    token[1, 2] = 100.0  # on padding: ignored
    for fn in (
        compute_opo_outcome_advantage,
        compute_gpg_outcome_advantage,
        compute_reinforce_plus_plus_baseline_outcome_advantage,
    ):
        torch.testing.assert_close(fn(token, GROUPS, MASK), fn(SCORES, GROUPS, MASK))


def test_entries_read_the_context_and_config():
    ctx = SimpleNamespace(rewards=lambda: SCORES[:5], group_index=GROUPS[:5], response_mask=MASK[:5])
    cfg = SimpleNamespace(gpg_f_norm=2.0, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(gpg_entry(cfg, ctx), compute_gpg_outcome_advantage(*_args(), f_norm=2.0))
    torch.testing.assert_close(
        grpo_passk_entry(cfg, ctx),
        compute_grpo_passk_outcome_advantage(*_args(), norm_adv_by_std_in_grpo=False),
    )
    torch.testing.assert_close(opo_entry(cfg, ctx), compute_opo_outcome_advantage(*_args()))
    torch.testing.assert_close(
        reinforce_plus_plus_baseline_entry(cfg, ctx),
        compute_reinforce_plus_plus_baseline_outcome_advantage(*_args()),
    )


def _args():
    return SCORES[:5], GROUPS[:5], MASK[:5]


def test_kl_in_reward_per_token_vs_summed():
    # Issue 15, difference 1. One group of two responses, T = 3, beta = 0.5, k1 per token:
    # row 0: kl = [.2, .4, 0]   (valid 3 tokens), score 1 -> token rewards [-.1, -.2, 1 - 0] = [-.1, -.2, 1]
    # row 1: kl = [.6, 0, pad]  (valid 2 tokens), score 0 -> token rewards [-.3, 0, 0]
    old = torch.tensor([[0.2, 0.4, 0.0], [0.6, 0.0, 9.0]], dtype=D)
    ref = torch.zeros(2, 3, dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    scores, groups = torch.tensor([1.0, 0.0], dtype=D), torch.tensor([0, 0])
    rewards, metrics = apply_kl_in_reward(scores, old, ref, mask, beta=0.5, kl_penalty_type="k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, -0.2, 1.0], [-0.3, 0.0, 0.0]], dtype=D))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.6 / 3 + 0.6 / 2) / 2)
    # GRPO sums the token rewards: same as subtracting beta * sum(kl) from the score (.7 and -.3)
    summed = scores - 0.5 * (old * mask).sum(-1)
    torch.testing.assert_close(
        compute_grpo_outcome_advantage(rewards, groups, mask),
        compute_grpo_outcome_advantage(summed, groups, mask),
    )
    # REINFORCE++ (gamma 1) returns-to-go differ: per token row 0 = [.7, .8, 1], summed = [.7, .7, .7]
    per_token = compute_reinforce_plus_plus_outcome_advantage(rewards, groups, mask)
    on_last = compute_reinforce_plus_plus_outcome_advantage(summed, groups, mask)
    assert not torch.allclose(per_token, on_last)
    # returns per token: row 0 [.7, .8, 1], row 1 [-.3, 0]: mean 2.2/5 = .44, unbiased std of
    # [.7, .8, 1, -.3, 0]: squared deviations .0676 + .1296 + .3136 + .5476 + .1936 = 1.252, var 1.252 / 4
    # = .313, std .5594640 -> row 0 token 0: (.7 - .44) / .5594640 = .4647305
    assert per_token[0, 0].item() == pytest.approx(0.4647305, abs=1e-6)
