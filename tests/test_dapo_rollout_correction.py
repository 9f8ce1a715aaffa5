"""DAPO dynamic sampling and overlong shaping, rollout/trainer mismatch correction (TIS, masked IS,
metrics) and the adaptive KL controller, on hand-computed tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.tensors import t
from train.algorithms.dapo import (
    check_gen_batches,
    filter_values,
    overlong_penalty,
    select_groups,
    varied_groups,
)
from train.algorithms.kl_control import KLController, adaptive_kl_coef
from train.algorithms.registry import Knob
from train.algorithms.rollout_correction import (
    ROLLOUT_CORRECTION_KNOBS,
    masked_is_mask,
    mismatch_metrics,
    parse_rejection,
    rollout_correction,
    truncated_is_weights,
)


def test_varied_groups_drops_groups_with_equal_rewards():
    # group 0 mixed -> kept; group 1 all 1 -> dropped; group 2 all .1 -> dropped (exact equality, even where
    # a float std would be 1e-17); group 3 has one response -> kept
    metric = t([1, 1, 0, 1, 1, 1, 0.1, 0.1, 0.1, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
    keep = varied_groups(metric, groups)
    assert keep.tolist() == [True] * 3 + [False] * 6 + [True]


def test_filter_values_by_metric():
    # scores [1, 1]; the second response is overlong (penalty -.5) and pays an in-reward KL of .25
    scores, correct, overlong, kl = [1.0, 1.0], [1.0, 0.0], t([0.0, -0.5]), t([0.0, 0.25])
    assert filter_values("score", scores, correct, overlong, kl).tolist() == [1.0, 1.0]
    assert filter_values("acc", scores, correct, overlong, kl).tolist() == [1.0, 0.0]
    assert filter_values("seq_reward", scores, correct, overlong, kl).tolist() == [
        1.0,
        0.5,
    ]  # score + penalty
    assert filter_values("seq_final_reward", scores, correct, overlong, kl).tolist() == [1.0, 0.25]
    # without shaping and in-reward KL the sequence rewards are the scores
    assert filter_values("seq_final_reward", scores).tolist() == [1.0, 1.0]
    # the group is dropped by `score` (equal) but kept by `seq_reward` (the penalty makes them differ)
    groups = torch.tensor([0, 0])
    assert not varied_groups(filter_values("score", scores, overlong=overlong), groups).any()
    assert varied_groups(filter_values("seq_reward", scores, overlong=overlong), groups).all()
    with pytest.raises(ValueError, match="filter_groups_metric=acc needs a reward that reports correctness"):
        filter_values("acc", scores)


def test_select_groups_takes_the_first_kept_groups_in_order():
    # two generation batches concatenated; kept groups in order of appearance: 5, 3, 8
    groups = torch.tensor([5, 5, 4, 4, 3, 3, 8, 8])
    keep = torch.tensor([True, True, False, False, True, True, True, True])
    rows, n = select_groups(keep, groups, 2)
    assert rows.tolist() == [0, 1, 4, 5] and n == 2
    rows, n = select_groups(keep, groups, 5)
    assert rows.tolist() == [0, 1, 4, 5, 6, 7] and n == 3  # fewer than wanted: generate more


def test_check_gen_batches_cap():
    assert check_gen_batches(num_gen_batches=1, max_num_gen_batches=3, groups=2, wanted=4)
    assert not check_gen_batches(num_gen_batches=1, max_num_gen_batches=3, groups=4, wanted=4)
    assert check_gen_batches(num_gen_batches=50, max_num_gen_batches=0, groups=2, wanted=4)  # 0 = no cap
    with pytest.raises(RuntimeError, match="3 generation batches gave 2 of 4 groups.*max_num_gen_batches"):
        check_gen_batches(num_gen_batches=3, max_num_gen_batches=3, groups=2, wanted=4)


def test_overlong_penalty_ramp():
    # limit 20, buffer 4: free up to 16 tokens, then -(len - 16) / 4: 17 -> -.25, 20 -> -1 (times factor)
    got = overlong_penalty(torch.tensor([10, 16, 17, 20]), 20, 4)
    assert got.tolist() == [0.0, 0.0, -0.25, -1.0]
    assert overlong_penalty(torch.tensor([18]), 20, 4, penalty_factor=0.5).tolist() == [-0.25]
    with pytest.raises(ValueError, match="overlong_buffer_len=0 must be in"):
        overlong_penalty(torch.tensor([1]), 20, 0)


# train logp - rollout logp: row 0 = [1, -.5, .2] (all valid), row 1 = [-1, 5, 5] with only token 0 valid
LOG_RATIO = t([[1.0, -0.5, 0.2], [-1.0, 5.0, 5.0]])
MASK = t([[1, 1, 1], [1, 0, 0]])


def test_truncated_is_weights_token_and_sequence():
    # token: min(e^1, 2) = 2, e^-.5 = .6065307, e^.2 = 1.2214028; row 1: e^-1 = .3678794, padding 0
    w, m = truncated_is_weights(LOG_RATIO, MASK, "token", 2.0)
    torch.testing.assert_close(w, t([[2.0, math.exp(-0.5), math.exp(0.2)], [math.exp(-1), 0, 0]]))
    assert m["rollout_corr/is_fraction_truncated"] == 0.25  # 1 of 4 valid tokens over 2
    assert m["rollout_corr/is_mean"] == pytest.approx((2 + math.exp(-0.5) + math.exp(0.2) + math.exp(-1)) / 4)
    # sequence: row 0 product e^.7 = 2.0137527 -> 2 on every token; row 1 e^-1 (padding ignored)
    w, m = truncated_is_weights(LOG_RATIO, MASK, "sequence", 2.0)
    torch.testing.assert_close(w, t([[2.0, 2.0, 2.0], [math.exp(-1), 0, 0]]))
    assert m["rollout_corr/is_fraction_truncated"] == 0.5
    # batch-normalised token weights have mean 1 over valid tokens
    w, m = truncated_is_weights(LOG_RATIO, MASK, "token", 2.0, batch_normalize=True)
    assert float((w * MASK).sum() / MASK.sum()) == pytest.approx(1.0)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="rollout_is='tok' is unknown"):
        truncated_is_weights(LOG_RATIO, MASK, "tok")


def test_masked_is_drops_out_of_range_tokens_or_sequences():
    # bounds [.5, 2]: token ratios e^1 = 2.72 (out), .61 (in), 1.22 (in); e^-1 = .37 (out)
    mask, m = masked_is_mask(LOG_RATIO, MASK, "token", 0.5, 2.0)
    assert mask.tolist() == [[0, 1, 1], [0, 0, 0]] and mask.dtype == MASK.dtype
    assert m["rollout_corr/rs_masked_fraction"] == 0.5 and m["rollout_corr/rs_seq_masked_fraction"] == 1.0
    # sequence: row 0 product e^.7 = 2.01 > 2 -> whole row out; row 1 e^-1 out
    mask, _ = masked_is_mask(LOG_RATIO, MASK, "sequence", 0.5, 2.0)
    assert mask.tolist() == [[0, 0, 0], [0, 0, 0]]
    # geometric: row 0 e^(.7/3) = 1.26 in; row 1 e^-1 out
    mask, _ = masked_is_mask(LOG_RATIO, MASK, "geometric", 0.5, 2.0)
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0]]


def test_mismatch_metrics_by_hand():
    # train [-1, -2], rollout [-1.1, -1.5]: log ratio [.1, -.5]
    train, rollout, mask = t([[-1.0, -2.0]]), t([[-1.1, -1.5]]), t([[1, 1]])
    m = mismatch_metrics(train, rollout, mask)
    assert m["rollout_corr/kl"] == pytest.approx((-0.1 + 0.5) / 2)  # mean(rollout - train) = .2
    assert m["rollout_corr/ratio_max"] == pytest.approx(math.exp(0.1))
    assert m["rollout_corr/ratio_min"] == pytest.approx(math.exp(-0.5))
    k3 = ((math.exp(0.1) - 1 - 0.1) + (math.exp(-0.5) - 1 + 0.5)) / 2  # .0558507
    assert m["rollout_corr/k3_kl"] == pytest.approx(k3)
    assert m["rollout_corr/training_ppl"] == pytest.approx(math.exp(1.5))
    assert m["rollout_corr/rollout_ppl"] == pytest.approx(math.exp(1.3))
    assert m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(0.2)
    assert m["rollout_corr/chi2_token"] == pytest.approx((math.exp(0.2) + math.exp(-1.0)) / 2 - 1)
    with pytest.raises(ValueError, match="no valid token"):
        mismatch_metrics(train, rollout, mask * 0)


def test_adaptive_kl_controller():
    # error = clip(KL/target - 1, -.2, .2); coef *= 1 + error * n / horizon, n/horizon = 64/640 = .1
    assert adaptive_kl_coef(0.1, 0.3, 0.1, 640, 64) == pytest.approx(0.1 * 1.02)  # error 2 -> .2
    assert adaptive_kl_coef(0.1, 0.05, 0.1, 640, 64) == pytest.approx(0.1 * 0.98)  # error -.5 -> -.2
    assert adaptive_kl_coef(0.1, 0.11, 0.1, 640, 64) == pytest.approx(0.1 * 1.01)  # error .1
    ctrl = KLController(0.1, "adaptive", target_kl=0.1, horizon=640)
    ctrl.update(0.3, 64)
    assert ctrl.update(0.3, 64) == pytest.approx(0.1 * 1.02**2)
    fixed = KLController(0.1)
    assert fixed.update(5.0, 64) == 0.1
    with pytest.raises(ValueError, match="kl_ctrl.horizon must be > 0"):
        KLController(0.1, "adaptive", horizon=0)
    with pytest.raises(ValueError, match="kl_ctrl.type='pid' is unknown"):
        KLController(0.1, "pid")


def rc_cfg(**overrides):
    """The algorithm config's rollout-correction knobs: their defaults, then ``overrides``."""
    cfg = {k: v.default if isinstance(v, Knob) else v[0] for k, v in ROLLOUT_CORRECTION_KNOBS.items()}
    return SimpleNamespace(**{**cfg, **overrides})


def correct(log_ratio, mask, **overrides):
    """rollout_correction on train logp = log_ratio, rollout logp = 0."""
    return rollout_correction(log_ratio, torch.zeros_like(log_ratio), mask, rc_cfg(**overrides))


def test_sequence_is_weight_is_the_whole_sequence_ratio_whatever_rejection_drops():
    # token log-ratios [.1, 1, .2]; token rejection [.5, 2] drops the middle token (e^1 = 2.72 > 2); the
    # sequence weight is still the product over all three tokens: min(e^1.3, 5) = 3.669 (not e^.3 = 1.35)
    lr, mask = t([[0.1, 1.0, 0.2]]), t([[1, 1, 1]])
    loss_mask, w, m = correct(lr, mask, rollout_is="sequence", rollout_is_threshold=5.0, rollout_rs="token")
    assert loss_mask.tolist() == [[1, 0, 1]] and loss_mask.dtype == mask.dtype
    torch.testing.assert_close(w, t([[math.exp(1.3)] * 3]))
    assert m["rollout_corr/rs_masked_fraction"] == pytest.approx(1 / 3)
    # token-level weights too are those of every valid token (the rejected one keeps its weight, unused)
    _, w, _ = correct(lr, mask, rollout_is="token", rollout_is_threshold=5.0, rollout_rs="token")
    torch.testing.assert_close(w, torch.exp(lr))
    # both off: the response mask itself, no weights, no metrics
    assert correct(lr, mask) == (mask, None, {})


def test_batch_normalisation_over_the_response_mask_or_the_loss_mask():
    # ratios [1, 3, .5, 1.2]; token TIS at 2 -> weights [1, 2, .5, 1.2]; rejection [.6, 2] keeps 1 and 1.2
    lr, mask = torch.log(t([[1.0, 3.0, 0.5, 1.2]])), t([[1, 1, 1, 1]])
    on = dict(rollout_is="token", rollout_is_batch_normalize=True, rollout_rs="token", rollout_rs_lower=0.6)
    loss_mask, w, m = correct(lr, mask, **on)
    assert loss_mask.tolist() == [[1, 0, 0, 1]]
    # verl: mean over every valid token (4.7 / 4 = 1.175)
    assert m["rollout_corr/is_batch_norm_factor"] == pytest.approx(1.175)
    torch.testing.assert_close(w, t([[1.0, 2.0, 0.5, 1.2]]) / 1.175)
    # the option: mean over the kept tokens (2.2 / 2 = 1.1), so the loss sees weights of mean 1
    loss_mask, w, m = correct(lr, mask, **on, rollout_is_batch_normalize_mask="loss")
    assert m["rollout_corr/is_batch_norm_factor"] == pytest.approx(1.1)
    assert float((w * loss_mask).sum() / loss_mask.sum()) == pytest.approx(1.0)
    # sequence level: one weight per sequence; rows 0 (e^.5 = 1.65) and 1 (e^-.2 = .82; rejected)
    lr2, mask2 = t([[0.5, 0.0], [-0.2, 0.0]]), t([[1, 1], [1, 0]])
    seq = dict(rollout_is="sequence", rollout_is_batch_normalize=True, rollout_rs="geometric")
    _, _, m = correct(lr2, mask2, **seq, rollout_rs_lower=0.9)
    assert m["rollout_corr/is_batch_norm_factor"] == pytest.approx((math.exp(0.5) + math.exp(-0.2)) / 2)
    _, _, m = correct(lr2, mask2, **seq, rollout_rs_lower=0.9, rollout_is_batch_normalize_mask="loss")
    assert m["rollout_corr/is_batch_norm_factor"] == pytest.approx(math.exp(0.5))


def test_k2_and_k3_token_rejection():
    # log rho [1, -1, .2]: k2 = [.5, .5, .02]; k3 = rho - 1 - log rho = [e - 2 = .718, 1/e = .368, .0214]
    lr, mask = t([[1.0, -1.0, 0.2]]), t([[1, 1, 1]])
    assert correct(lr, mask, rollout_rs="token_k2", rollout_rs_threshold="0.4")[0].tolist() == [[0, 0, 1]]
    assert correct(lr, mask, rollout_rs="token_k3", rollout_rs_threshold="0.4")[0].tolist() == [[0, 1, 1]]
    assert correct(lr, mask, rollout_rs="token_k3", rollout_rs_threshold=0.75)[0].tolist() == [[1, 1, 1]]


def test_sequence_criteria_sum_mean_and_max():
    # row 0 [1, -1, .2]: k2 sum 1.02, mean .34, max .5; k3 mean (.718 + .368 + .0214) / 3 = .369
    # row 1 [.9, pad, pad] + [0, 0]: here [.9, 0, 0] all valid: k2 sum .405, mean .135, max .405
    # row 2 [.3, .3, pad]: k2 sum .09, max .045; k3 mean e^.3 - 1.3 = .0499
    lr = t([[1.0, -1.0, 0.2], [0.9, 0.0, 0.0], [0.3, 0.3, 7.0]])
    mask = t([[1, 1, 1], [1, 1, 1], [1, 1, 0]])  # row 2's padding (7.0) must be ignored

    def kept(option, threshold):
        m, _, metrics = correct(lr, mask, rollout_rs=option, rollout_rs_threshold=threshold)
        assert m.tolist()[2][2] == 0
        return [int(row.sum() > 0) for row in m]

    assert kept("seq_sum_k2", "1.0") == [0, 1, 1]
    assert kept("seq_sum_k2", "0.4") == [0, 0, 1]
    assert kept("seq_mean_k2", "0.3") == [0, 1, 1]
    assert kept("seq_max_k2", "0.3") == [0, 0, 1]
    assert kept("seq_mean_k3", "0.3") == [0, 1, 1]
    assert kept("seq_max_k3", "0.6") == [0, 1, 1]  # k3 max: .718, e^.9 - 1.9 = .560, .0499
    assert kept("seq_max_k3", "0.5") == [0, 0, 1]


def test_chained_criteria_and_verl_k1_bounds():
    # verl's k1 bounds are on pi_rollout / pi_train = 1 / rho: token_k1 "0.5_1.5" keeps .667 <= rho <= 2
    lr, mask = t([[0.6, -0.5, 0.0], [0.1, 0.1, 0.0]]), t([[1, 1, 1], [1, 1, 0]])
    assert correct(lr, mask, rollout_rs="token_k1", rollout_rs_threshold="0.5_1.5")[0].tolist() == [
        [1, 0, 1],
        [1, 1, 0],
    ]
    # the project's token bounds are on rho itself: [.5, 1.5] keeps .607, drops 1.82
    assert correct(lr, mask, rollout_rs="token", rollout_rs_upper=1.5)[0].tolist() == [[0, 1, 1], [1, 1, 0]]
    # one k1 number u means [1/u, u]
    assert correct(lr, mask, rollout_rs="token_k1", rollout_rs_threshold="1.5")[0].tolist() == [
        [0, 0, 1],
        [1, 1, 0],
    ]
    # chained: every criterion must pass; token_k1 drops token (0, 1), seq_max_k2 at .15 drops row 0
    # (max .18); one threshold entry per criterion
    m, _, metrics = correct(lr, mask, rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.5_1.5,0.15")
    assert m.tolist() == [[0, 0, 0], [1, 1, 0]]
    assert metrics["rollout_corr/rs_token_k1_masked_fraction"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/rs_seq_max_k2_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["rollout_corr/rs_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["rollout_corr/rs_seq_masked_fraction"] == 0.5
    # a shared entry applies to every criterion (k2 and k3 at .17: k2 of -.5 is .125, k3 .107, k2 of .6 .18)
    m, _, _ = correct(lr, mask, rollout_rs="token_k2,token_k3", rollout_rs_threshold=0.17)
    assert m.tolist() == [[0, 1, 1], [1, 1, 0]]


def test_rejection_config_errors_are_one_line_naming_the_key():
    with pytest.raises(ValueError, match="rollout_rs='token,seq_max_k2': .*cannot be chained"):
        parse_rejection("token,seq_max_k2", "1.0")
    with pytest.raises(ValueError, match="unknown 'seq_max_k1'"):
        parse_rejection("seq_max_k1", "1.0")
    with pytest.raises(ValueError, match="rollout_rs=token_k2 needs algorithm.rollout_rs_threshold"):
        parse_rejection("token_k2", None)
    with pytest.raises(ValueError, match="needs one entry or 2"):
        parse_rejection("token_k2,token_k3", "1,2,3")
    with pytest.raises(ValueError, match="'0.5_2' for token_k3: must be one number"):
        parse_rejection("token_k3", "0.5_2")
    with pytest.raises(ValueError, match="must be positive"):
        parse_rejection("token_k1", "0_2")


def test_rejection_clamps_token_log_ratios_at_20_before_summing():
    # log rho [25, -10]: verl sums the clamped values, 20 - 10 = 10 (seq_sum_k1 = -10), not 15;
    # bounds [e^-12, 1] on the k1 sum's exp keep -12 <= -10 <= 0 (a raw sum, -15, would be rejected)
    lr, mask = t([[25.0, -10.0]]), t([[1, 1]])
    spec = f"{math.exp(-12)}_1"
    assert correct(lr, mask, rollout_rs="seq_sum_k1", rollout_rs_threshold=spec)[0].tolist() == [[1, 1]]
    # token_k3 of a clamped token: e^20 - 21 = 4.85e8 <= 5e8 kept
    assert correct(lr, mask, rollout_rs="token_k3", rollout_rs_threshold=5e8)[0].tolist() == [[1, 1]]


def test_k3_kl_metric_is_exact_at_extreme_log_ratios():
    # one token at log ratio 25, one at 0: mean(rho - 1 - log rho) = (e^25 - 26) / 2 = 3.60e10 (clamping
    # at 20 first would give 2.43e8)
    m = mismatch_metrics(t([[25.0, 0.0]]), t([[0.0, 0.0]]), t([[1, 1]]))
    assert m["rollout_corr/k3_kl"] == pytest.approx((math.exp(25) - 26) / 2)
    assert m["rollout_corr/ratio_max"] == pytest.approx(math.exp(20))  # still the safety bound
