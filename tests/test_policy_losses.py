"""GSPO, Clip-Cov, KL-Cov, CISPO, GPG, SAPO, GMPO (geo_mean), bypass-mode per-token losses and the
straight-through KL variants, on hand-computed tensors (values and gradients)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.tensors import D, t
from train.algorithms.aggregation import agg_loss
from train.algorithms.kl import kl_penalty
from train.algorithms.policy_losses import (
    POLICY_LOSS_KNOBS,
    bypass_mode_loss,
    cispo_entry,
    cispo_loss,
    clip_cov_entry,
    clip_cov_loss,
    geo_mean_entry,
    geo_mean_loss,
    gpg_entry,
    gpg_loss,
    gspo_entry,
    gspo_loss,
    kl_cov_entry,
    kl_cov_loss,
    sapo_entry,
    sapo_loss,
)
from train.algorithms.registry import Knob
from train.algorithms.rollout_correction import ROLLOUT_CORRECTION_KNOBS


def test_gspo_one_ratio_per_sequence():
    # row 0: log ratios [.5, .5] -> s = e^.5 = 1.6487 > 1.2 with A = 1: clipped branch -1.2 on both tokens
    # row 1: log ratios [0, -.2], padding -> mean -.1 -> s = e^-.1 = .9048374 inside [.8, 1.2], A = -1:
    # both tokens .9048374 although their own token ratios are 1 and .8187
    logp = t([[-1.0, -2.0], [-1.0, -3.0]]).requires_grad_()
    old = t([[-1.5, -2.5], [-1.0, -2.8]])
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = gspo_loss(old, logp, adv, torch.ones(2, 2))
    s = math.exp(-0.1)
    torch.testing.assert_close(loss, t([[-1.2, -1.2], [s, s]]))
    assert metrics["pg_clipfrac"] == 0.5 and metrics["pg_clipfrac_lower"] == 0.0
    assert metrics["ppo_kl"] == pytest.approx((-0.5 - 0.5 + 0 + 0.2) / 4)
    loss.sum().backward()
    # clipped row: no gradient; row 1: d(-A s_t)/dlogp_t = -A * s = s on each token
    torch.testing.assert_close(logp.grad, t([[0.0, 0.0], [s, s]]))
    # padding does not enter the sequence ratio: a third token masked out changes nothing
    padded, _ = gspo_loss(
        t([[-1.0, -2.8, 0.0]]), t([[-1.0, -3.0, 5.0]]), t([[-1.0, -1.0, -1.0]]), t([[1, 1, 0]])
    )
    torch.testing.assert_close(padded[0, :2], t([s, s]))


# cov_t = (A_t - mean A)(logp_t - mean logp): A = [2, 2, -2, -2] (mean 0), logp = [-.1, -3, -.1, -3]
# (mean -1.55) -> cov = [2.9, -2.9, -2.9, 2.9]: tokens 0 and 3 lie in (lb 1, ub 5)
COV_ADV = t([[2.0, 2.0, -2.0, -2.0]])
COV_LOGP = t([[-0.1, -3.0, -0.1, -3.0]])


def test_clip_cov_cuts_the_gradient_of_high_covariance_tokens():
    logp = COV_LOGP.clone().requires_grad_()
    # ratio 1 (old = logp): PPO loss -A = [-2, -2, 2, 2]; clip_cov_ratio .5 -> int(.5 * 4) = 2 tokens cut
    loss, metrics = clip_cov_loss(COV_LOGP, logp, COV_ADV, torch.ones(1, 4), clip_cov_ratio=0.5)
    torch.testing.assert_close(loss, t([[0.0, -2.0, 2.0, 0.0]]))
    assert metrics["pg_clipfrac"] == 0.5
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[0.0, -2.0, 2.0, 0.0]]))  # -A * ratio' = -A where kept
    # ratio .25 -> one token: a random one of the two candidates (seeded generator: reproducible)
    one, _ = clip_cov_loss(
        COV_LOGP,
        COV_LOGP,
        COV_ADV,
        torch.ones(1, 4),
        clip_cov_ratio=0.25,
        generator=torch.Generator().manual_seed(0),
    )
    cut = (one == 0).nonzero()[:, 1].tolist()
    assert len(cut) == 1 and cut[0] in (0, 3)
    # tokens the PPO clip already handles are never candidates: ratio e^.5 on token 0 with A > 0 is clipped
    old = COV_LOGP - t([[0.5, 0.0, 0.0, 0.0]])
    shifted, _ = clip_cov_loss(old, COV_LOGP, COV_ADV, torch.ones(1, 4), clip_cov_ratio=0.5)
    assert shifted[0, 0].item() == pytest.approx(-2 * 1.2) and shifted[0, 3] == 0


def test_kl_cov_penalises_the_top_covariance_tokens():
    # A = [2, 2, -2, -2], logp = [-.1, -3, -.5, -2] (mean -1.4): cov = [2.6, -3.2, -1.8, 1.2];
    # kl_cov_ratio .5 -> int(.5 * 4) = 2 tokens: 0 and 3. old = logp - .1: ratio e^.1 = 1.1051709, |kl| .1
    logp = t([[-0.1, -3.0, -0.5, -2.0]])
    loss, metrics = kl_cov_loss(
        logp - 0.1, logp, COV_ADV, torch.ones(1, 4), kl_cov_ratio=0.5, ppo_kl_coef=0.1
    )
    r = math.exp(0.1)
    torch.testing.assert_close(loss, t([[-2 * r + 0.01, -2 * r, 2 * r, 2 * r + 0.01]]))
    assert metrics["kl_cov_frac"] == 0.5 and metrics["ppo_kl"] == pytest.approx(-0.1)
    # a tiny ratio still penalises one token (max(1, int(ratio * N)))
    one, _ = kl_cov_loss(logp - 0.1, logp, COV_ADV, torch.ones(1, 4), kl_cov_ratio=1e-4, ppo_kl_coef=0.1)
    assert (one - (-COV_ADV * r)).abs().gt(1e-9).sum() == 1 and one[0, 0] == pytest.approx(-2 * r + 0.01)
    # masked tokens are never chosen: mask token 0 -> the top valid token is 3
    masked, _ = kl_cov_loss(logp - 0.1, logp, COV_ADV, t([[0, 1, 1, 1]]), kl_cov_ratio=1e-4, ppo_kl_coef=0.1)
    assert masked[0, 3].item() == pytest.approx(2 * r + 0.01)


def test_cispo_clips_the_weight_not_the_gradient():
    # ratios e^.5 = 1.6487 -> weight 1.2, e^-.5 = .6065 -> weight .8; A = 1; L = -w * A * logp
    logp = t([[-1.0, -1.0]]).requires_grad_()
    loss, metrics = cispo_loss(t([[-1.5, -0.5]]), logp, t([[1.0, 1.0]]), torch.ones(1, 2))
    torch.testing.assert_close(loss, t([[1.2, 0.8]]))
    assert metrics["pg_clipfrac"] == 1.0
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-1.2, -0.8]]))  # both tokens keep a gradient (PPO: none)


def test_gpg_and_sapo():
    logp = t([[-1.0, -2.0]]).requires_grad_()
    loss, _ = gpg_loss(logp.detach(), logp, t([[1.0, -1.0]]), torch.ones(1, 2))
    torch.testing.assert_close(loss, t([[1.0, -2.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-1.0, 1.0]]))
    # SAPO at ratio 1: gate = sigmoid(0) * 4 / tau = 2 / tau (tau 1 for A > 0, 2 for A <= 0): L = [-2, 1];
    # gate slope at 1 is tau * 1/4 * 4 / tau = 1, so the gradient is PPO's: -A
    logp = t([[-1.0, -2.0]]).requires_grad_()
    loss, _ = sapo_loss(logp.detach(), logp, t([[1.0, -1.0]]), torch.ones(1, 2), tau_pos=1.0, tau_neg=2.0)
    torch.testing.assert_close(loss, t([[-2.0, 1.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-1.0, 1.0]]))


def test_straight_through_kl_value_of_one_gradient_of_k2():
    # logp = .5, ref = 0: k3 value = e^-.5 + .5 - 1 = .1065307, k1 value .5; k2's gradient is logp - ref = .5
    for kind, value in (("k3+", math.exp(-0.5) - 0.5), ("low_var_kl+", math.exp(-0.5) - 0.5), ("k1+", 0.5)):
        logp = t([0.5]).requires_grad_()
        kl = kl_penalty(logp, t([0.0]), kind)
        assert kl.item() == pytest.approx(value), kind
        kl.sum().backward()
        assert logp.grad.item() == pytest.approx(0.5), kind
    logp = t([0.5]).requires_grad_()
    kl_penalty(logp, t([0.0]), "k1").sum().backward()
    assert logp.grad.item() == 1.0  # plain k1: gradient 1
    with pytest.raises(ValueError, match="unknown KL penalty 'k4\\+'.*'k3\\+'"):
        kl_penalty(logp, t([0.0]), "k4+")


def test_entries_pass_their_knobs():
    cfg = SimpleNamespace(
        clip_ratio_low=0.1,
        clip_ratio_high=0.3,
        clip_cov_ratio=0.5,
        clip_cov_lb=1.0,
        clip_cov_ub=5.0,
        kl_cov_ratio=0.5,
        ppo_kl_coef=0.1,
        tau_pos=1.0,
        tau_neg=2.0,
    )
    args = (COV_LOGP - 0.3, COV_LOGP, COV_ADV, torch.ones(1, 4))
    torch.testing.assert_close(gspo_entry(*args, cfg)[0], gspo_loss(*args, 0.1, 0.3)[0])
    torch.testing.assert_close(cispo_entry(*args, cfg)[0], cispo_loss(*args, 0.1, 0.3)[0])
    torch.testing.assert_close(clip_cov_entry(*args, cfg)[0], clip_cov_loss(*args, 0.1, 0.3, 0.5)[0])
    torch.testing.assert_close(kl_cov_entry(*args, cfg)[0], kl_cov_loss(*args, 0.5, 0.1)[0])
    torch.testing.assert_close(gpg_entry(*args, cfg)[0], gpg_loss(*args)[0])
    torch.testing.assert_close(sapo_entry(*args, cfg)[0], sapo_loss(*args, 1.0, 2.0)[0])
    # every knob an entry reads is declared for it
    for mode, entry in (("gspo", gspo_entry), ("cispo", cispo_entry), ("kl_cov", kl_cov_entry)):
        declared = set(POLICY_LOSS_KNOBS[mode])
        entry(*args, SimpleNamespace(**{k: getattr(cfg, k) for k in declared}))


def test_sapo_and_cispo_ppo_kl_clamp_the_log_ratio_at_20():
    # logp - old = [-30, 0]: verl (and vanilla PPO) average -clamp(.., -20, 20) = [20, 0] -> 10, not 15
    old, logp, adv, mask = t([[0.0, 0.0]]), t([[-30.0, 0.0]]), t([[1.0, 1.0]]), torch.ones(1, 2)
    assert sapo_loss(old, logp, adv, mask)[1]["ppo_kl"] == pytest.approx(10.0)
    assert cispo_loss(old, logp, adv, mask)[1]["ppo_kl"] == pytest.approx(10.0)
    assert gspo_loss(old, logp, adv, mask)[1]["ppo_kl"] == pytest.approx(15.0)  # verl's gspo: raw


# GMPO: old = 0; row 0 d = [.3, -.1] with A = 1, row 1 d = [.5, -.3] with A = -1, third token padding
GEO_LOGP, GEO_ADV = t([[0.3, -0.1, 9.0], [0.5, -0.3, 9.0]]), t([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
GEO_MASK = t([[1, 1, 0], [1, 1, 0]])


def test_geo_mean_clips_token_log_ratios_and_averages_them_per_sequence():
    # row 0 (A > 0): min(d, clamp(d, -.2, .2)) = [.2, -.1] -> r = e^.05, L = -e^.05;
    # row 1 (A < 0): -min(-d, -clamp(d)) = max(d, clamp(d)) = [.5, -.2] -> r = e^.15, L = +e^.15
    logp = GEO_LOGP.clone().requires_grad_()
    loss, metrics = geo_mean_loss(torch.zeros(2, 3, dtype=D), logp, GEO_ADV, GEO_MASK, 0.2, 0.2)
    l0, l1 = -math.exp(0.05), math.exp(0.15)
    torch.testing.assert_close(loss, t([[l0, l0, 0.0], [l1, l1, 0.0]]))
    assert metrics["pg_clipfrac"] == 0.25 and metrics["pg_clipfrac_lower"] == 0.5  # (0, 0); (1, 0), (1, 1)
    assert metrics["ppo_kl"] == pytest.approx(-(0.3 - 0.1 + 0.5 - 0.3) / 4)
    # seq-mean-token-mean = verl's mean over sequences; gradient -A_i r_i / len_i on unclipped tokens only
    agg_loss(loss, GEO_MASK, "seq-mean-token-mean").backward()
    torch.testing.assert_close(logp.grad, t([[0.0, l0 / 2, 0.0], [l1 / 2, 0.0, 0.0]]) / 2)
    # rollout-correction weights enter as the geometric mean per sequence: row 0 sqrt(2 * 2) = 2, row 1
    # sqrt(.25 * 1) = .5 (padding ignored)
    w = t([[2.0, 2.0, 0.0], [0.25, 1.0, 0.0]])
    loss, _ = geo_mean_loss(torch.zeros(2, 3, dtype=D), GEO_LOGP, GEO_ADV, GEO_MASK, 0.2, 0.2, is_weights=w)
    torch.testing.assert_close(loss, t([[2 * l0, 2 * l0, 0.0], [l1 / 2, l1 / 2, 0.0]]), rtol=1e-9, atol=1e-9)
    # the entry takes the weights from extras (it applies them itself)
    cfg = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.2)
    got, _ = geo_mean_entry(torch.zeros(2, 3, dtype=D), GEO_LOGP, GEO_ADV, GEO_MASK, cfg, {"is_weights": w})
    torch.testing.assert_close(got, loss)


def bypass_cfg(**overrides):
    cfg = {k: v.default if isinstance(v, Knob) else v[0] for k, v in ROLLOUT_CORRECTION_KNOBS.items()}
    cfg.update(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_type="ppo_clip")
    return SimpleNamespace(**{**cfg, **overrides})


def test_bypass_mode_reinforce_and_ppo_clip():
    # rollout logp [-1, -2, -1]; current = rollout + [.1, 1, .2]; A = 1
    rollout = t([[-1.0, -2.0, -1.0]])
    on = dict(rollout_is="sequence", rollout_is_threshold=5.0, rollout_rs="token")
    # reinforce: w = min(e^1.3, 5) on every token (the whole sequence's ratio), token rejection [.5, 2]
    # drops the middle token: L = -w A logp = w * [.9, 0, .8]; gradient -w A on kept tokens
    logp = (rollout + t([[0.1, 1.0, 0.2]])).requires_grad_()
    loss, m = bypass_mode_loss(
        rollout, logp, torch.ones(1, 3, dtype=D), torch.ones(1, 3), bypass_cfg(**on, loss_type="reinforce")
    )
    w = math.exp(1.3)
    torch.testing.assert_close(loss, t([[0.9 * w, 0.0, 0.8 * w]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-w, 0.0, -w]]))
    assert m["rollout_corr/rs_masked_fraction"] == pytest.approx(1 / 3) and m["ppo_kl"] == pytest.approx(
        -0.15
    )
    # ppo_clip: old = rollout, ratios [1.105, 2.718 (rejected), 1.221 -> clipped at 1.2]; no IS weights
    logp = (rollout + t([[0.1, 1.0, 0.2]])).requires_grad_()
    loss, m = bypass_mode_loss(rollout, logp, torch.ones(1, 3, dtype=D), torch.ones(1, 3), bypass_cfg(**on))
    torch.testing.assert_close(loss, t([[-math.exp(0.1), 0.0, -1.2]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-math.exp(0.1), 0.0, 0.0]]))
    assert m["pg_clipfrac"] == 0.5  # of the kept tokens
    assert "rollout_corr/is_mean" in m  # weights computed for the metrics, as verl
    with pytest.raises(ValueError, match="algorithm.loss_type='ppo' is unknown"):
        bypass_mode_loss(
            rollout, logp, torch.ones(1, 3, dtype=D), torch.ones(1, 3), bypass_cfg(loss_type="ppo")
        )
