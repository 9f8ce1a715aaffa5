"""Advantage estimators against hand-computed values (arithmetic in the comments)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.tensors import t
from train.algorithms import registry
from train.algorithms.advantages import (
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    masked_whiten,
    scores_to_token_rewards,
)


def assert_close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, t(expected, actual.dtype), atol=atol, rtol=0)


# Six responses in three groups (ids unsorted and non-contiguous on purpose), T = 3.
SCORES = t([1.0, 0.0, 2.0, 4.0, 6.0, 5.0])
GROUPS = torch.tensor([7, 7, 3, 3, 3, 9])
MASK = t([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])


def test_table_names():
    registry.load_entries()
    assert {"grpo", "rloo", "reinforce_plus_plus", "remax"} <= set(registry.ADV_ESTIMATORS)
    assert registry.adv_estimator("remax").needs == ("baseline_scores",)
    with pytest.raises(ValueError, match="grpo"):
        registry.adv_estimator("gae_typo")


def test_grpo_single_group_from_brief():
    # [1,0,1,1]: mean 0.75, deviations [.25,-.75,.25,.25], sum sq 0.75, unbiased var 0.75/3 = 0.25, std 0.5
    # A = dev / (0.5 + 1e-6): 0.25/0.500001 = 0.499999, -0.75/0.500001 = -1.499997
    adv = compute_grpo_outcome_advantage(
        t([1.0, 0.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long), torch.ones(4, 2)
    )
    assert_close(
        adv, [[0.499999, 0.499999], [-1.499997, -1.499997], [0.499999, 0.499999], [0.499999, 0.499999]]
    )


def test_grpo_groups_mask_and_group_of_one():
    adv = compute_grpo_outcome_advantage(SCORES, GROUPS, MASK)
    # group 7 = [1, 0]: mean .5, std sqrt((.25+.25)/1) = .7071068 -> +-.5/.7071078 = +-.7071058
    # group 3 = [2, 4, 6]: mean 4, std sqrt((4+0+4)/2) = 2 -> [-2, 0, 2]/2.000001 = [-.9999995, 0, .9999995]
    # group 9 = [5] alone: mean 0, std 1 -> 5/1.000001 = 4.999995
    expected = [
        [0.7071058, 0.7071058, 0.7071058],
        [-0.7071058, 0.0, 0.0],
        [-0.9999995, -0.9999995, 0.0],
        [0.0, 0.0, 0.0],
        [0.9999995, 0.0, 0.0],
        [4.999995, 4.999995, 4.999995],
    ]
    assert_close(adv, expected)


def test_dr_grpo_no_std():
    adv = compute_grpo_outcome_advantage(SCORES, GROUPS, MASK, norm_adv_by_std_in_grpo=False)
    # s - mean_g: group 7 [.5, -.5], group 3 [-2, 0, 2], group 9 alone (mean 0) [5]
    expected = [[0.5] * 3, [-0.5, 0, 0], [-2, -2, 0], [0, 0, 0], [2, 0, 0], [5, 5, 5]]
    assert_close(adv, expected)


def test_grpo_all_equal_group_is_zero_and_float32_input():
    # std 0 -> 0 / (0 + 1e-6) = 0, not NaN; integer scores are accepted and promoted
    adv = compute_grpo_outcome_advantage(torch.tensor([3, 3, 3]), torch.tensor([0, 0, 0]), torch.ones(3, 4))
    assert adv.dtype == torch.float32
    assert torch.equal(adv, torch.zeros(3, 4))


def test_grpo_token_level_rewards_are_summed():
    # (B, T) rewards: row sums over VALID tokens [1, 0, 1, 1] (the 9 sits on a padded token) = brief example
    rewards = t([[0, 0, 1], [0, 0, 9], [0.5, 0.5, 0], [1, 0, 0]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    adv = compute_grpo_outcome_advantage(rewards, torch.zeros(4, dtype=torch.long), mask)
    assert_close(adv[:, 0], [0.499999, -1.499997, 0.499999, 0.499999])
    assert adv[1, 2] == 0


def test_rloo():
    adv = compute_rloo_outcome_advantage(
        t([1.0, 0.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long), torch.ones(4, 1)
    )
    # leave-one-out: 1 - (0+1+1)/3 = 1/3; 0 - (1+1+1)/3 = -1
    assert_close(adv[:, 0], [1 / 3, -1.0, 1 / 3, 1 / 3])
    adv = compute_rloo_outcome_advantage(SCORES, GROUPS, MASK)
    # group 7: 1-0 = 1, 0-1 = -1; group 3: 2-5 = -3, 4-4 = 0, 6-3 = 3; group of one keeps its score 5
    expected = [[1, 1, 1], [-1, 0, 0], [-3, -3, 0], [0, 0, 0], [3, 0, 0], [5, 5, 5]]
    assert_close(adv, expected)


def test_scores_to_token_rewards():
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = scores_to_token_rewards(t([2.0, 3.0, 4.0]), mask)
    assert_close(out, [[0, 2, 0], [0, 0, 3], [0, 0, 0]])  # no valid token -> reward dropped
    with pytest.raises(ValueError):
        scores_to_token_rewards(t([1.0]), mask)


def test_reinforce_plus_plus_gamma_1():
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv = compute_reinforce_plus_plus_outcome_advantage(t([1.0, 3.0]), None, mask)
    # rewards [[0,0,1],[0,3,0]] -> returns (gamma 1) [[1,1,1],[3,3,-]]; valid 1,1,1,3,3: mean 1.8,
    # sum sq dev 3*.64 + 2*1.44 = 4.8, unbiased var 4.8/4 = 1.2, std 1.0954451
    # -> -.8/1.0954451 = -.7302967, 1.2/1.0954451 = 1.0954451; padded token 0
    assert_close(adv, [[-0.7302967] * 3, [1.0954451, 1.0954451, 0.0]])


def test_reinforce_plus_plus_discount_and_token_rewards():
    mask = t([[1, 1, 1], [1, 1, 0]])
    # gamma .5: returns [[.25,.5,1],[1.5,3,-]]; mean 6.25/5 = 1.25; devs -1,-.75,-.25,.25,1.75;
    # sum sq 1+.5625+.0625+.0625+3.0625 = 4.75; var 4.75/4 = 1.1875; std 1.0897247
    expected = [[-0.9176629, -0.6882472, -0.2294157], [0.2294157, 1.6059101, 0.0]]
    adv = compute_reinforce_plus_plus_outcome_advantage(t([1.0, 3.0]), None, mask, gamma=0.5)
    assert_close(adv, expected)
    # the same rewards given token-level, with junk on the padded token (ignored: returns reset after EOS)
    token_rewards = t([[0, 0, 1], [0, 3, 100]])
    adv2 = compute_reinforce_plus_plus_outcome_advantage(token_rewards, None, mask, gamma=0.5)
    assert_close(adv2, expected)


def test_masked_whiten_degenerate():
    # one valid token: nothing to scale by, centred to 0; none: zeros
    assert_close(masked_whiten(t([[5.0, 7.0]]), t([[1, 0]])) * t([[1, 0]]), [[0.0, 0.0]])
    assert_close(masked_whiten(t([[5.0, 7.0]]), t([[0, 0]])), [[0.0, 0.0]])


def test_remax():
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv = compute_remax_outcome_advantage(t([1.0, 0.5]), None, mask, baselines=t([0.5, 1.0]))
    # 1 - .5 = .5 on every valid token; .5 - 1 = -.5, padded 0
    assert_close(adv, [[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])
    with pytest.raises(ValueError, match="baselines"):
        compute_remax_outcome_advantage(t([1.0, 0.5]), None, mask)


def test_table_entries_call_the_functions_with_config_and_context():
    cfg = SimpleNamespace(norm_adv_by_std_in_grpo=False, gamma=0.5)
    ctx = registry.AdvantageContext(SCORES, MASK, GROUPS, baseline_scores=SCORES)
    expected = {
        "grpo": compute_grpo_outcome_advantage(SCORES, GROUPS, MASK, norm_adv_by_std_in_grpo=False),
        "rloo": compute_rloo_outcome_advantage(SCORES, GROUPS, MASK),
        "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage(SCORES, GROUPS, MASK, gamma=0.5),
        "remax": compute_remax_outcome_advantage(SCORES, GROUPS, MASK, baselines=SCORES),
    }
    for name, want in expected.items():
        got = registry.as_output(registry.adv_estimator(name).fn(cfg, ctx)).advantages
        torch.testing.assert_close(got, want)
        assert torch.all(got[MASK == 0] == 0), name
