"""Losses, KL penalties, log-prob/entropy helpers against hand-computed values (arithmetic in comments)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.tensors import D, t
from train.algorithms.actor_loss import actor_loss, policy_loss
from train.algorithms.aggregation import LOSS_AGG_MODES, agg_loss, global_normalisers
from train.algorithms.dpo import dpo_loss
from train.algorithms.kl import apply_kl_in_reward, kl_penalty
from train.algorithms.presets import DR_GRPO, PRESETS, get_preset
from train.policy.logprobs import entropy_from_logits, entropy_from_logits_chunked, logprobs_from_logits


def assert_close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, t(expected, actual.dtype), atol=atol, rtol=0)


# ---------------------------------------------------------------- agg_loss

LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 1000.0]])  # 1000 sits on a padded token
LMASK = t([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 3.0),  # (1+2+3+4+5) / 5
        ("seq-mean-token-sum", 7.5),  # (6 + 9) / 2
        ("seq-mean-token-mean", 3.25),  # (6/3 + 9/2) / 2 = (2 + 4.5) / 2
        ("seq-mean-token-sum-norm", 5.0),  # 15 / T=3
    ],
)
def test_agg_loss_modes(mode, expected):
    assert_close(agg_loss(LOSS, LMASK, mode), expected)


def test_agg_loss_scale_factor_and_globals():
    assert_close(agg_loss(LOSS, LMASK, "seq-mean-token-sum-norm", loss_scale_factor=10), 1.5)  # 15/10
    assert_close(agg_loss(LOSS, LMASK, "token-mean", global_token_count=10), 1.5)  # 15/10
    assert_close(agg_loss(LOSS, LMASK, "seq-mean-token-sum", global_seq_count=5), 3.0)  # 15/5
    assert_close(agg_loss(LOSS, LMASK, "seq-mean-token-mean", global_seq_count=5), 1.3)  # 6.5/5
    with pytest.raises(ValueError):
        agg_loss(LOSS, LMASK, "seq-mean-token-sum-norm", loss_scale_factor=0)


def test_agg_loss_ignores_padding_rows_and_nonfinite_padding():
    loss = torch.cat([LOSS, t([[9.0, 9.0, 9.0]])])
    loss[1, 2] = float("inf")
    mask = torch.cat([LMASK, t([[0, 0, 0]])])
    # the fully masked row counts nowhere: same numbers as test_agg_loss_modes
    for mode, expected in [("token-mean", 3.0), ("seq-mean-token-sum", 7.5), ("seq-mean-token-mean", 3.25)]:
        assert_close(agg_loss(loss, mask, mode), expected)


def test_agg_loss_empty_mask_is_zero_with_graph():
    x = torch.ones(2, 3, requires_grad=True)
    for mode in LOSS_AGG_MODES:
        out = agg_loss(x * 2, torch.zeros(2, 3), mode)
        assert out.item() == 0.0
        out.backward()
        assert torch.equal(x.grad, torch.zeros(2, 3))
        x.grad = None


def test_agg_loss_bad_mode():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(LOSS, LMASK, "token_mean")


def test_global_normalisers():
    mask = t([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert global_normalisers(mask) == {
        "global_token_count": 6,
        "global_seq_count": 2,
        "loss_scale_factor": 4,
    }
    assert global_normalisers(mask, loss_scale_factor=512)["loss_scale_factor"] == 512


# ------------------------------------------------ micro-batch accumulation equivalence

LENGTHS = [5, 1, 3, 2, 4, 6]


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = len(LENGTHS), max(LENGTHS)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).to(D)
    return torch.randn(B, T, generator=g, dtype=D), torch.randn(B, T, generator=g, dtype=D), mask


def _splits(mask):
    # token-budget style: uneven micro-batches, each re-padded to its own longest response
    out = []
    for rows in ([0, 1], [2, 3, 4], [5]):
        width = int(mask[rows].sum(-1).max())
        out.append((rows, width))
    return out


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_grad_equals_full_batch(mode):
    raw, weight, mask = _batch()
    theta_full = raw.clone().requires_grad_(True)
    agg_loss(weight * theta_full**2, mask, mode).backward()

    norms = global_normalisers(mask)
    theta = raw.clone().requires_grad_(True)
    total = 0.0
    for rows, width in _splits(mask):
        micro = agg_loss((weight * theta**2)[rows, :width], mask[rows, :width], mode, **norms)
        micro.backward()
        total += micro.item()
    torch.testing.assert_close(theta.grad, theta_full.grad, atol=1e-12, rtol=0)
    assert total == pytest.approx(agg_loss(weight * raw**2, mask, mode).item(), abs=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_without_globals_differs(mode):
    # guard: the naive "average the micro-batch losses" is wrong here, so the test above can fail
    raw, weight, mask = _batch()
    theta_full = raw.clone().requires_grad_(True)
    agg_loss(weight * theta_full**2, mask, mode).backward()
    theta = raw.clone().requires_grad_(True)
    splits = _splits(mask)
    for rows, width in splits:
        (agg_loss((weight * theta**2)[rows, :width], mask[rows, :width], mode) / len(splits)).backward()
    assert not torch.allclose(theta.grad, theta_full.grad)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_actor_loss_micro_batch_equivalence(mode):
    raw, adv, mask = _batch(1)
    old = raw.detach() - 0.1
    ref = raw.detach() + 0.05
    ent = raw.detach().abs()
    kwargs = dict(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.5, loss_agg_mode=mode)

    lp_full = raw.clone().requires_grad_(True)
    ent_full = ent.clone().requires_grad_(True)
    loss_full, _ = actor_loss(old, lp_full, adv, mask, entropy=ent_full, ref_log_prob=ref, **kwargs)
    loss_full.backward()

    norms = global_normalisers(mask)
    lp = raw.clone().requires_grad_(True)
    e = ent.clone().requires_grad_(True)
    for rows, w in _splits(mask):
        micro, _ = actor_loss(
            old[rows, :w], lp[rows, :w], adv[rows, :w], mask[rows, :w],
            entropy=e[rows, :w], ref_log_prob=ref[rows, :w], **kwargs, **norms,
        )  # fmt: skip
        micro.backward()
    torch.testing.assert_close(lp.grad, lp_full.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(e.grad, ent_full.grad, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- policy loss

# token 0: A=1,  rho=1.5 -> max(-1.5, -1.2) = -1.2 (clipped)
# token 1: A=-1, rho=0.5 -> max(0.5, 0.8) = 0.8 (clipped); dual bound 3 inactive
# token 2: A=-1, rho=4   -> max(4, 1.2) = 4; dual clip min(3, 4) = 3 (active)
# token 3: A=2,  rho=1   -> -2 (no clip)
# token 4: masked (A=100)
PG_LOGP = t([[math.log(1.5), math.log(0.5), math.log(4.0), 0.0, 1.0]])
PG_OLD = torch.zeros(1, 5, dtype=D)
PG_ADV = t([[1.0, -1.0, -1.0, 2.0, 100.0]])
PG_MASK = t([[1, 1, 1, 1, 0]])


def test_policy_loss_hand_computed_with_dual_clip():
    logp = PG_LOGP.clone().requires_grad_(True)
    loss, m = policy_loss(PG_OLD, logp, PG_ADV, PG_MASK)
    assert_close(loss, 0.15)  # (-1.2 + 0.8 + 3 - 2) / 4
    assert m["pg_clipfrac"] == pytest.approx(0.5)  # tokens 0, 1
    assert m["pg_clipfrac_lower"] == pytest.approx(0.25)  # token 2
    assert m["ppo_kl"] == pytest.approx(-math.log(3.0) / 4)  # -(ln1.5 + ln.5 + ln4 + 0)/4 = -ln3/4
    loss.backward()
    # only the unclipped token 3 has a gradient: d(-A*rho)/dlogp / 4 = -2*1/4
    assert_close(logp.grad, [[0.0, 0.0, 0.0, -0.5, 0.0]])


def test_policy_loss_other_mode_and_asymmetric_clip():
    loss, _ = policy_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK, loss_agg_mode="seq-mean-token-sum-norm")
    assert_close(loss, 0.12)  # 0.6 / T=5
    # clip_high 0.6: token 0 is unclipped (1.5 < 1.6) -> -1.5; sum -1.5 + .8 + 3 - 2 = 0.3 -> /4
    loss, m = policy_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK, clip_ratio_high=0.6)
    assert_close(loss, 0.075)
    assert m["pg_clipfrac"] == pytest.approx(0.25)


def test_policy_loss_ratio_clamp():
    # logp - old = 50 is clamped to 20: with no upper clip the loss is -A*exp(20), not -exp(50)
    loss, m = policy_loss(t([[0.0]]), t([[50.0]]), t([[1.0]]), t([[1.0]]), clip_ratio_high=1e30)
    assert loss.item() == pytest.approx(-485165195.4097903, rel=1e-12)  # -exp(20)
    assert m["ppo_kl"] == pytest.approx(-20.0)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_policy_loss_bad_dual_clip(c):
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK, clip_ratio_c=c)


# ---------------------------------------------------------------- KL

LOGP = t([-1.0, -2.0, -0.5])
REF = t([-1.5, -1.0, -0.5])  # logp - ref = [.5, -1, 0]


@pytest.mark.parametrize(
    "kinds, expected",
    [
        (("k1", "kl"), [0.5, -1.0, 0.0]),
        (("abs",), [0.5, 1.0, 0.0]),
        (("k2", "mse"), [0.125, 0.5, 0.0]),  # .5 * d^2
        # x = ref - logp = [-.5, 1, 0]: e^-.5 + .5 - 1 = .1065307; e - 2 = .7182818; 0
        (("k3", "low_var_kl"), [0.1065307, 0.7182818, 0.0]),
    ],
)
def test_kl_penalty(kinds, expected):
    for kind in kinds:
        assert_close(kl_penalty(LOGP, REF, kind), expected)


def test_kl_k3_clamps():
    # x = 30 -> clamp 20 -> e^20 - 21 -> clamp 10; x = -30 -> -20 -> e^-20 + 19 -> 10; x = 3 -> e^3 - 4 = 16.1 -> 10
    assert_close(kl_penalty(t([0.0, 0.0, 0.0]), t([30.0, -30.0, 3.0]), "low_var_kl"), [10.0, 10.0, 10.0])


def test_kl_bad_name():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_apply_kl_in_reward():
    scores = t([[0, 0, 1], [0, 2, 0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    old = t([[-1, -1, -1], [-2, -2, -2]])
    ref = t([[-1.5, -1, -0.5], [-1, -2, -9]])
    # k1 = old - ref = [[.5, 0, -.5], [-1, 0, (7 masked)]]; rewards = scores - .1 * k1
    rewards, m = apply_kl_in_reward(scores, old, ref, mask, beta=0.1)
    assert_close(rewards, [[-0.05, 0.0, 1.05], [0.1, 2.0, 0.0]])
    assert m["actor/reward_kl_penalty"] == pytest.approx(-0.25)  # mean(0/3, -1/2)
    assert m["actor/reward_kl_penalty_coeff"] == 0.1
    # (B,) scores are placed on the last valid token first: same result
    rewards1, _ = apply_kl_in_reward(t([1.0, 2.0]), old, ref, mask, beta=0.1)
    assert_close(rewards1, [[-0.05, 0.0, 1.05], [0.1, 2.0, 0.0]])


# ---------------------------------------------------------------- entropy / log-probs

LN3 = math.log(3.0)


def test_entropy_hand_values_and_stability():
    logits = t(
        [
            [[0.0, 0.0, 0.0, 0.0], [0.0, LN3, -math.inf, -math.inf]],
            [[1000.0, 1000.0, 0, 0], [1000, -1000, 0, 0]],
        ]
    )
    # uniform over 4: ln4 = 1.3862944; p = [1/4, 3/4]: .25 ln4 + .75 ln(4/3) = .5623351
    # [1000, 1000, 0, 0]: ~uniform over 2 -> ln2 = .6931472; [1000, -1000, ...]: one-hot -> 0 (no NaN)
    expected = [[1.3862944, 0.5623351], [0.6931472, 0.0]]
    assert_close(entropy_from_logits(logits), expected)
    assert_close(entropy_from_logits_chunked(logits, chunk_size=1), expected)
    assert entropy_from_logits(logits.to(torch.bfloat16)).dtype == torch.float32


def test_entropy_grad_matches_definition():
    # d/dz of the stable form equals that of the textbook -sum p log p (fp64, no extreme logits)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 7, generator=g, dtype=D)
    a = z.clone().requires_grad_(True)
    (entropy_from_logits(a) * torch.arange(4.0)).sum().backward()
    b = z.clone().requires_grad_(True)
    p = torch.softmax(b, -1)
    (-(p * torch.log(p)).sum(-1) * torch.arange(4.0)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


def test_logprobs_hand_values():
    logits = t([[[0.0, LN3], [0.0, LN3], [1000.0, 1000.0]]])
    labels = torch.tensor([[1, 0, 0]])
    # ln(3/4) = -.2876821, ln(1/4) = -1.3862944, ln(1/2) = -.6931472
    expected = [[-0.2876821, -1.3862944, -0.6931472]]
    assert_close(logprobs_from_logits(logits, labels), expected)
    with pytest.raises(ValueError):
        logprobs_from_logits(logits, torch.tensor([[1, 0]]))


def test_logprobs_grad_hand_value():
    # d ln p_1 / d logits = onehot - softmax = [0, 1] - [1/4, 3/4] = [-.25, .25]
    logits = t([[[0.0, LN3]]]).requires_grad_(True)
    logprobs_from_logits(logits, torch.tensor([[1]])).sum().backward()
    assert_close(logits.grad, [[[-0.25, 0.25]]])


def test_logprobs_bf16_chunked_matches_fp32():
    g = torch.Generator().manual_seed(0)
    logits16 = (torch.randn(2, 5, 11, generator=g) * 4).to(torch.bfloat16)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    weights = torch.randn(2, 5, generator=g)
    # reference: the same bf16 values in fp64 (exactly representable), plain log_softmax
    ref_in = logits16.to(D).requires_grad_(True)
    ref = torch.log_softmax(ref_in, -1).gather(-1, labels[..., None]).squeeze(-1)
    (ref * weights.to(D)).sum().backward()

    x = logits16.clone().requires_grad_(True)
    out = logprobs_from_logits(x, labels, chunk_size=3)  # 10 rows -> chunks of 3, 3, 3, 1
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.to(D), ref.detach(), atol=1e-5, rtol=0)  # fp32 maths, not bf16
    (out * weights).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(x.grad.to(D), ref_in.grad, atol=2e-2, rtol=1e-2)


# ---------------------------------------------------------------- actor loss


def test_actor_loss_combines_terms():
    logp = PG_LOGP.clone().requires_grad_(True)
    entropy = t([[1.0, 2.0, 3.0, 2.0, 100.0]]).requires_grad_(True)
    ref = PG_LOGP - 0.1  # k1 = logp - ref = .1 everywhere
    loss, m = actor_loss(
        PG_OLD, logp, PG_ADV, PG_MASK,
        entropy=entropy, entropy_coeff=0.01, ref_log_prob=ref, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1",
    )  # fmt: skip
    # pg .15 - .01 * mean(1,2,3,2)=2 + .5 * .1 = .15 - .02 + .05 = .18
    assert_close(loss, 0.18)
    assert m["actor/pg_loss"] == pytest.approx(0.15)
    assert m["actor/entropy"] == pytest.approx(2.0)
    assert m["actor/kl_loss"] == pytest.approx(0.1)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    assert m["actor/ppo_kl"] == pytest.approx(-math.log(3.0) / 4)
    loss.backward()
    assert_close(entropy.grad, [[-0.0025] * 4 + [0.0]])  # -.01 / 4 on valid tokens


def test_actor_loss_defaults_and_errors():
    loss, m = actor_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK)
    assert_close(loss, 0.15)
    assert set(m) == {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK, entropy_coeff=0.01)
    with pytest.raises(ValueError, match="ref_log_prob"):
        actor_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK, use_kl_loss=True)
    with pytest.raises(ValueError, match="unknown KL"):
        actor_loss(PG_OLD, PG_LOGP, PG_ADV, PG_MASK, use_kl_loss=True, ref_log_prob=PG_LOGP, kl_loss_type="x")


# ---------------------------------------------------------------- DPO and presets


def test_dpo_loss():
    pc, pr = t([-1.0, -3.0]), t([-2.0, -1.0])
    rc, rr = t([-1.5, -2.0]), t([-1.5, -2.0])
    # chosen = .5*(pc - rc) = [.25, -.5]; rejected = .5*(pr - rr) = [-.25, .5]; margins [.5, -1]
    # -log sigmoid(.5) = ln(1 + e^-.5) = .4740770; -log sigmoid(-1) = ln(1 + e) = 1.3132617; mean .8936693
    loss, m = dpo_loss(pc, pr, rc, rr, beta=0.5)
    assert_close(loss, 0.8936693)
    assert m == pytest.approx(
        {
            "rewards/chosen": -0.125,
            "rewards/rejected": 0.125,
            "rewards/accuracy": 0.5,
            "rewards/margin": -0.25,
        }
    )
    loss4, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, global_pair_count=4)
    assert_close(loss4, 0.4468347)  # (0.4740770 + 1.3132617) / 4


def test_presets():
    assert DR_GRPO["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert DR_GRPO["norm_adv_by_std_in_grpo"] is False
    assert DR_GRPO["use_kl_loss"] is False and DR_GRPO["use_kl_in_reward"] is False
    assert PRESETS["grpo"]["loss_agg_mode"] == "token-mean"
    p = get_preset("dr_grpo")
    p["loss_agg_mode"] = "token-mean"
    assert DR_GRPO["loss_agg_mode"] == "seq-mean-token-sum-norm"  # a copy
    with pytest.raises(ValueError, match="dr_grpo"):
        get_preset("drgrpo")
