"""GAE, the clipped value loss and critic warm-up on hand-computed tensors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.tensors import D, t
from train.algorithms.gae import actor_trains_at, compute_gae_advantage_return, gae_entry, value_loss


def test_gae_lambda_one_is_monte_carlo_minus_value():
    # rewards [0, 0, 1], V = [.5, .6, .7], gamma = lam = 1:
    # delta2 = 1 - .7 = .3, A2 = .3; delta1 = 0 + .7 - .6 = .1, A1 = .1 + .3 = .4; delta0 = .6 - .5 = .1, A0 = .5
    # returns = A + V = [1, 1, 1] (the Monte-Carlo return); A whitened: mean .4, unbiased std .1 -> [1, 0, -1]
    out = compute_gae_advantage_return(t([[0, 0, 1.0]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]]))
    torch.testing.assert_close(out.returns, t([[1.0, 1.0, 1.0]]))
    torch.testing.assert_close(out.advantages, t([[1.0, 0.0, -1.0]]), atol=1e-5, rtol=0)


def test_gae_discount_and_lambda():
    # gamma .9, lam .5 (gamma*lam = .45): A2 = .3; delta1 = .9*.7 - .6 = .03, A1 = .03 + .45*.3 = .165;
    # delta0 = .9*.6 - .5 = .04, A0 = .04 + .45*.165 = .11425; returns = A + V = [.61425, .765, 1.0]
    out = compute_gae_advantage_return(
        t([[0, 0, 1.0]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]]), gamma=0.9, lam=0.5
    )
    torch.testing.assert_close(out.returns, t([[0.61425, 0.765, 1.0]]))
    raw = torch.tensor([0.11425, 0.165, 0.3], dtype=D)
    torch.testing.assert_close(out.advantages[0], (raw - raw.mean()) / raw.std(), atol=1e-6, rtol=0)


def test_gae_skips_masked_tokens_and_padding():
    # mask [1, 0, 1]: the hole's value 9 is never used; A2 = .3, V_next = .7 carried over the hole:
    # delta0 = 0 + .7 - .5 = .2, A0 = .2 + .3 = .5. Row 2 is [1, 1, 0] with outcome score 2 placed on
    # token 1: A1 = 2 - .4 = 1.6, A0 = (0 + .4 - .1) + 1.6 = 1.9. Returns 0 on masked positions.
    values = t([[0.5, 9.0, 0.7], [0.1, 0.4, 5.0]])
    mask = t([[1, 0, 1], [1, 1, 0]])
    out = compute_gae_advantage_return(t([1.0, 2.0]), values, mask)  # (B,) scores -> last valid token
    torch.testing.assert_close(out.returns, t([[1.0, 0, 1.0], [2.0, 2.0, 0]]))
    raw = torch.tensor([0.5, 0.3, 1.9, 1.6], dtype=D)
    whitened = (raw - raw.mean()) / raw.std()
    torch.testing.assert_close(out.advantages[mask.bool()], whitened, atol=1e-6, rtol=0)
    assert out.advantages[0, 1] == 0 and out.advantages[1, 2] == 0


def test_value_loss_clip_by_hand():
    # token 0: V = 1, V_old = 0, R = 1.5, clip .5 -> clipped V .5: (.5 - 1.5)^2 = 1 > (1 - 1.5)^2 = .25 -> 1
    # token 1: V = 2, V_old = 2.1 -> clip(2, 1.6, 2.6) = 2: both (2 - 0)^2 = 4 -> 4
    # token 2: padding. token-mean: .5 * (1 + 4) / 2 = 1.25; clipfrac 1/2
    vpreds = t([[1.0, 2.0, 7.0]]).requires_grad_()
    loss, metrics = value_loss(vpreds, t([[1.5, 0.0, 0.0]]), t([[0.0, 2.1, 0.0]]), t([[1, 1, 0]]), 0.5)
    assert loss.item() == pytest.approx(1.25)
    assert metrics["critic/vf_clipfrac"] == 0.5
    assert metrics["critic/vf_loss"] == pytest.approx(1.25)
    assert metrics["critic/vpred_mean"] == pytest.approx(1.5)
    loss.backward()
    # token 0 takes the clipped branch (flat in V): no gradient; token 1: .5 * 2 * (2 - 0) / 2 = 1
    torch.testing.assert_close(vpreds.grad, t([[0.0, 1.0, 0.0]]))
    # global normaliser: the same tokens counted against a 4-token mini-batch halve the loss
    half, _ = value_loss(
        vpreds, t([[1.5, 0.0, 0.0]]), t([[0.0, 2.1, 0.0]]), t([[1, 1, 0]]), 0.5, global_token_count=4
    )
    assert half.item() == pytest.approx(0.625)


def test_critic_warmup_and_entry():
    assert [actor_trains_at(s, 2) for s in range(4)] == [False, False, True, True]
    assert actor_trains_at(0, 0)
    cfg = SimpleNamespace(gamma=1.0, lam=1.0)
    ctx = SimpleNamespace(
        rewards=lambda: t([[0, 0, 1.0]]), values=t([[0.5, 0.6, 0.7]]), response_mask=t([[1, 1, 1]])
    )
    torch.testing.assert_close(gae_entry(cfg, ctx).returns, t([[1.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="adv_estimator=gae needs the critic's values"):
        gae_entry(cfg, SimpleNamespace(rewards=ctx.rewards, values=None, response_mask=ctx.response_mask))
