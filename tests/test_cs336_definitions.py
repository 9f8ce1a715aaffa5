"""CS336 assignment 5's definitions, from the handout's formulas, on hand-computed values: the masked helpers
with `dim`, the SFT step's per-sequence constant normalisation, the group-normalised rewards and the three
policy-gradient losses reached through `preset=cs336*`."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from train.algorithms import registry
from train.algorithms.actor_loss import policy_loss
from train.algorithms.aggregation import masked_mean, masked_normalize
from train.config import build_config
from train.stages.sft import make_sft_loss_fn

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # the second row fully masked


def test_masked_mean_along_a_dim_and_a_fully_masked_row_gives_zero():
    assert masked_mean(X, M).item() == 1.5
    torch.testing.assert_close(masked_mean(X, M, dim=-1), torch.tensor([1.5, 0.0]))  # course: [1.5, nan]
    torch.testing.assert_close(masked_mean(X, M, dim=0), torch.tensor([1.0, 2.0, 0.0]))


def test_masked_normalize_sums_and_divides_by_the_constant():
    assert masked_normalize(X, M, 2.0).item() == 1.5
    torch.testing.assert_close(masked_normalize(X, M, 2.0, dim=-1), torch.tensor([1.5, 0.0]))
    torch.testing.assert_close(masked_normalize(X, M, 0.5, dim=0), torch.tensor([2.0, 4.0, 0.0]))


def test_sft_sequence_constant_is_the_course_microbatch_loss_summed_over_accumulation():
    """Course: per micro-batch, loss = mean_b(-sum_t logp * mask / c) / gradient_accumulation_steps.
    Four sequences in two micro-batches of two (accumulation 2), c = 4."""
    lp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0], [-0.5, -1.5, -2.0], [-4.0, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    c, gas = 4.0, 2
    course = sum(
        ((-(lp[i : i + 2] * mask[i : i + 2]).sum(-1) / c).mean() / gas).item() for i in (0, 2)
    )  # (3/4 + 3/4) / 2 / 2 + (4/4 + 4/4) / 2 / 2 = 0.875
    assert course == pytest.approx(0.875)
    loss_fn = make_sft_loss_fn(7, 1, "sequence_constant", c, global_seq_count=4)
    ours = sum(
        loss_fn(SimpleNamespace(response_mask=mask[i : i + 2], rows=torch.arange(2)), lp[i : i + 2], None)[
            0
        ].item()
        for i in (0, 2)
    )
    assert ours == pytest.approx(course)
    with pytest.raises(ValueError, match="normalization must be one of"):
        make_sft_loss_fn(7, 1, "per_token")


def _course_grpo_clip(old, new, adv, mask, eps=0.2):
    """Handout: -min(rho A, clip(rho, 1-eps, 1+eps) A), masked mean per sequence, then the batch mean."""
    rho = torch.exp(new - old)
    per_token = -torch.minimum(rho * adv, torch.clamp(rho, 1 - eps, 1 + eps) * adv)
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


OLD = torch.zeros(2, 3)
NEW = torch.tensor([[math.log(5.0), 0.0, 0.0], [math.log(0.5), math.log(1.1), 0.0]])
ADV = torch.tensor([[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_preset_cs336_is_the_textbook_clip_with_per_sequence_means():
    algo = build_config(preset="cs336").algorithm
    assert algo.adv_estimator == "grpo" and algo.use_kl_loss is False
    loss, _ = policy_loss(OLD, NEW, ADV, MASK, algo.clip_ratio_low, algo.clip_ratio_high, algo.clip_ratio_c,
                          algo.loss_agg_mode)  # fmt: skip
    # row 1: tokens 5 (rho 5, A -1: min(-5, -1.2), no dual clip at 3) and 1 -> 3;
    # row 2: rho 0.5 -> min(1, 1.6) = 1, rho 1.1 -> 2.2, rho 1 -> 2: -5.2 / 3
    expected = (3.0 + (-5.2 / 3)) / 2
    assert loss.item() == pytest.approx(expected)
    assert _course_grpo_clip(OLD, NEW, ADV, MASK).item() == pytest.approx(expected)
    default, _ = policy_loss(OLD, NEW, ADV, MASK)  # the project's default: dual clip, token mean
    assert default.item() != pytest.approx(expected)


def test_no_baseline_and_reinforce_with_baseline_presets():
    scores, group = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    ctx = registry.AdvantageContext(scores, mask, group)
    raw = build_config(preset="cs336_no_baseline").algorithm
    adv = registry.adv_estimator(raw.adv_estimator).fn(raw, ctx)
    torch.testing.assert_close(adv, scores.unsqueeze(-1) * mask)  # the raw reward
    base = build_config(preset="cs336_reinforce_with_baseline").algorithm
    adv = registry.adv_estimator(base.adv_estimator).fn(base, ctx)
    std = math.sqrt(4 * 0.25 / 3)  # torch.std: unbiased
    assert adv[0, 0].item() == pytest.approx(0.5 / (std + 1e-6)) and adv[1, 1].item() == 0.0
    # the naive policy gradient -A log pi, per-sequence mean then batch mean
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -7.0], [-1.0, -1.0], [-0.5, -0.5]])
    per_token, _ = registry.policy_loss(base.policy_loss_mode).fn(logp, logp, adv, mask, base)
    seq = (per_token * mask).sum(-1) / mask.sum(-1)
    a = 0.5 / (std + 1e-6)
    expected = (a * 2.0 + (-a) * 2.0 + (-a) * 1.0 + a * 0.5) / 4
    assert seq.mean().item() == pytest.approx(expected)
    assert base.loss_agg_mode == raw.loss_agg_mode == "seq-mean-token-mean"
