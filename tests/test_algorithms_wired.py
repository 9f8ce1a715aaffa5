"""Issue 15, phase 2: verl's estimators, loss modes, KL in reward, adaptive KL, PPO with a critic, DAPO
and rollout correction are selectable from config and train through the real GRPO step (tiny model, HF
engine). The algorithms themselves are pinned on hand-computed tensors elsewhere (test_group_estimators,
test_policy_losses, test_gae_critic, test_dapo_rollout_correction); these tests check the wiring."""

from __future__ import annotations

import math

import pytest
import torch

from train.algorithms import registry
from train.config import ConfigError, build_config


def _cfg(tiny_model, tmp_path, *extra):
    cfg = build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "track=false", "total_steps=2",
            "save_every=0", "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=2",
            "data.builtin_size=16", "rollout.n=3", "rollout.max_new_tokens=6", "optim.lr=1e-3",
            "rollout.engine._target_=train.rollout.hf_engine.HFEngine", "policy.precision=fp32", *extra,
        ]
    )  # fmt: skip
    cfg.run_name = "wired"
    return cfg


@pytest.fixture
def spy(monkeypatch):
    """Records the AdvantageContext the configured estimator receives."""
    seen: list = []

    def wrap(name):
        entry = registry.adv_estimator(name)

        def fn(cfg, ctx):
            seen.append(ctx)
            return entry.fn(cfg, ctx)

        monkeypatch.setitem(registry.ADV_ESTIMATORS, name, registry.Entry(**{**entry.__dict__, "fn": fn}))
        return seen

    return wrap


# ---- config (fast) -------------------------------------------------------------------------------------
def test_verl_names_are_config_keys_with_one_line_errors():
    for name in ("reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk", "gae"):
        assert build_config(overrides=[f"algorithm.adv_estimator={name}"]).algorithm.adv_estimator == name
    for mode in ("gspo", "clip_cov", "kl_cov", "cispo", "gpg", "sapo"):
        assert (
            build_config(overrides=[f"algorithm.policy_loss_mode={mode}"]).algorithm.policy_loss_mode == mode
        )
    assert build_config(overrides=["algorithm.kl_loss_type=k3+"]).algorithm.kl_loss_type == "k3+"
    for preset in ("gspo", "sapo"):
        algo = build_config(preset=preset).algorithm
        assert (algo.policy_loss_mode, algo.loss_agg_mode) == (preset, "seq-mean-token-mean")
    bad = {
        "algorithm.kl_ctrl.type=pid": "algorithm.kl_ctrl.type='pid' must be one of fixed, adaptive",
        "algorithm.kl_ctrl.horizon=0": "algorithm.kl_ctrl.horizon=0 must be > 0",
        "algorithm.kl_penalty=k9": "algorithm.kl_penalty='k9' must be one of",
        "algorithm.kl_loss_type=k9+": "algorithm.kl_loss_type='k9\\+'",
        "algorithm.rollout_is=word": "algorithm.rollout_is='word' must be one of",
        "algorithm.rollout_rs_upper=-1": "algorithm.rollout_rs_upper=-1.0 must be > 0",
        "algorithm.overlong_buffer_len=100": "overlong_buffer_len=100 must be <= rollout.max_new_tokens=64",
        "algorithm.lam=2": r"algorithm.lam=2.0 must be in \[0, 1\]",
        "critic.warmup_steps=2": "critic.warmup_steps needs a critic: .*algorithm.adv_estimator=gae",
        "algorithm.filter_groups_metric=f1": "algorithm.filter_groups_metric='f1' must be one of",
        "algorithm.rollout_rs=seq_max_k1": "algorithm.rollout_rs='seq_max_k1' must be a comma list of",
        "algorithm.rollout_rs=token_k2": "algorithm.rollout_rs=token_k2 needs algorithm.rollout_rs_threshold",
        "algorithm.loss_type=ppo": "algorithm.loss_type='ppo' must be one of",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            build_config(overrides=[override])
    with pytest.raises(ConfigError, match="seq_final_reward with use_kl_in_reward=true is not supported"):
        build_config(
            overrides=["algorithm.filter_groups_metric=seq_final_reward", "algorithm.use_kl_in_reward=true"]
        )
    with pytest.raises(ConfigError, match="rollout_rs_threshold='1,2,3' needs one entry or 2"):
        build_config(
            overrides=["algorithm.rollout_rs='token_k2,token_k3'", "algorithm.rollout_rs_threshold='1,2,3'"]
        )
    with pytest.raises(ConfigError, match="critic.warmup_steps=5 leaves no actor step in total_steps=5"):
        build_config(overrides=["algorithm.adv_estimator=gae", "critic.warmup_steps=5", "total_steps=5"])


# ---- one real step per mode (slow) ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, metric",
    [
        (["algorithm.adv_estimator=reinforce_plus_plus_baseline"], None),
        (["algorithm.adv_estimator=opo"], None),
        (["algorithm.adv_estimator=gpg", "algorithm.policy_loss_mode=gpg"], None),
        (["algorithm.adv_estimator=grpo_passk"], None),
        (["preset_gspo"], "actor/pg_clipfrac"),
        (["algorithm.policy_loss_mode=clip_cov", "algorithm.clip_cov_lb=-1e9", "algorithm.clip_cov_ub=1e9"], "actor/pg_clipfrac"),
        (["algorithm.policy_loss_mode=kl_cov"], "actor/kl_cov_frac"),
        (["algorithm.policy_loss_mode=cispo"], "actor/pg_clipfrac"),
        (["preset_sapo"], "actor/ppo_kl"),
        (["algorithm.use_kl_loss=true", "algorithm.kl_loss_type=low_var_kl+"], "actor/kl_loss"),
        (["algorithm.policy_loss_mode=geo_mean", "algorithm.loss_agg_mode=seq-mean-token-mean", "algorithm.rollout_is=token"], "rollout_corr/is_mean"),
        (["algorithm.policy_loss_mode=bypass_mode", "algorithm.loss_type=reinforce", "algorithm.rollout_is=sequence"], "actor/rollout_corr/is_mean"),
    ],
)  # fmt: skip
def test_each_mode_trains_a_step(overrides, metric, tiny_model, dist_group, tmp_path, spy):
    from train.algorithms.presets import get_preset
    from train.stages.grpo import GRPOTrainer

    keys = []
    for o in overrides:  # presets as their algorithm.* keys
        keys += (
            [f"algorithm.{k}={v}" for k, v in get_preset(o[7:]).items()] if o.startswith("preset_") else [o]
        )
    cfg = _cfg(tiny_model, tmp_path, *keys)
    seen = spy(cfg.algorithm.adv_estimator)
    trainer = GRPOTrainer(cfg)
    before = {k: v.clone() for k, v in trainer.policy.full_weights()}
    m = trainer.step(1)
    trainer.close()
    assert len(seen) == 1  # the configured estimator ran
    after = dict(trainer.policy.full_weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert m["actor/grad_norm"] > 0 and math.isfinite(m["actor/pg_loss"])
    if metric:
        assert math.isfinite(m[metric])
    if "algorithm.policy_loss_mode=clip_cov" in keys:  # every token is a candidate: at least one is cut
        assert m["actor/pg_clipfrac"] > 0
    # the rollout/trainer mismatch is logged every step, correction or not (HF engine: same weights, fp32)
    assert m["rollout_corr/ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert abs(m["rollout_corr/kl"]) < 1e-4


@pytest.mark.slow
def test_kl_in_reward_per_token_adaptive_coefficient_and_gamma(tiny_model, dist_group, tmp_path, spy):
    from train.algorithms.kl_control import adaptive_kl_coef
    from train.stages.grpo import GRPOTrainer

    cfg = _cfg(
        tiny_model, tmp_path, "algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.5",
        "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=low_var_kl", "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.1", "algorithm.kl_ctrl.target_kl=1e-6", "algorithm.kl_ctrl.horizon=6",
    )  # fmt: skip
    seen = spy("reinforce_plus_plus")
    trainer = GRPOTrainer(cfg)
    first = trainer.step(1)
    second = trainer.step(2)
    trainer.close()
    assert first["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)  # the coefficient is logged
    # step 1 measured KL 0 (policy = reference): error -1 -> clipped -0.2, n/horizon = 6/6
    expected = adaptive_kl_coef(0.1, first["actor/reward_kl_penalty"], 1e-6, 6, 6)
    assert first["actor/reward_kl_penalty"] == 0
    assert expected == pytest.approx(0.08)
    assert second["actor/reward_kl_penalty_coeff"] == pytest.approx(expected)
    assert (
        second["actor/reward_kl_penalty"] > 0 and trainer.plugin_state["kl_coef"] > expected
    )  # KL above target
    ctx = seen[1]  # step 2: the policy has moved from the reference, so KL is in every token's reward
    mask = ctx.response_mask.bool()
    last = mask.sum(-1) - 1
    inner = mask.clone()
    inner[torch.arange(len(last)), last] = False
    assert inner.any() and bool((ctx.token_rewards[inner] < 0).all())  # -beta * k3 before the last token
    assert torch.allclose(ctx.scores, ctx.token_rewards.sum(-1))


@pytest.mark.slow
def test_dapo_dynamic_sampling_and_overlong(tiny_model, dist_group, tmp_path, spy):
    from tests.rewards_for_tests import HalfConstantReward
    from train.stages.grpo import GRPOTrainer

    cfg = _cfg(
        tiny_model, tmp_path, "reward._target_=tests.rewards_for_tests.HalfConstantReward",
        "algorithm.filter_groups=true", "algorithm.max_num_gen_batches=20", "algorithm.overlong_buffer_len=4",
        "algorithm.overlong_penalty_factor=0.5",
    )  # fmt: skip
    seen = spy("grpo")
    HalfConstantReward.CALLS.clear()
    trainer = GRPOTrainer(cfg)
    m = trainer.step(1)
    trainer.close()
    prompts = [p for call in HalfConstantReward.CALLS for p in call[::3]]  # one row per response, n = 3
    constant = sum(len(p) % 2 == 0 for p in prompts)
    assert m["train/num_gen_batches"] == len(HalfConstantReward.CALLS)
    assert m["train/generated_groups"] == len(prompts) and m["train/dropped_groups"] == constant
    assert trainer.extra_gen_batches == len(HalfConstantReward.CALLS) - 1  # later steps read further on
    ctx = seen[0]
    assert len(ctx.scores) == 2 * 3  # the batch is full: prompts_per_step groups of n
    lengths = ctx.response_mask.sum(-1)
    penalty = torch.clamp(-(lengths - 2) / 4 * 0.5, max=0.0)
    raw = ctx.scores - penalty
    for g in ctx.group_index.unique():  # every kept group's raw rewards vary
        assert raw[ctx.group_index == g].unique().numel() > 1
    assert m["train/overlong_penalty_mean"] == pytest.approx(float(penalty.mean()))


@pytest.mark.slow
def test_dynamic_sampling_cap_is_one_line(tiny_model, dist_group, tmp_path):
    from train.stages.grpo import GRPOTrainer

    cfg = _cfg(
        tiny_model, tmp_path, "reward._target_=tests.rewards_for_tests.ConstantReward",
        "algorithm.filter_groups=true", "algorithm.max_num_gen_batches=2",
    )  # fmt: skip
    trainer = GRPOTrainer(cfg)
    with pytest.raises(RuntimeError, match="2 generation batches gave 0 of 2 groups.*max_num_gen_batches"):
        trainer.step(1)
    trainer.close()


@pytest.mark.slow
def test_rollout_correction_reaches_the_loss(tiny_model, dist_group, tmp_path):
    from train.stages.grpo import GRPOTrainer

    def norm(*extra):
        trainer = GRPOTrainer(_cfg(tiny_model, tmp_path, "seed=3", *extra))
        m = trainer.step(1)
        trainer.close()
        return m

    plain = norm()
    assert "rollout_corr/is_mean" not in plain  # off by default; the mismatch itself is still logged
    assert plain["rollout_corr/ratio_max"] == pytest.approx(1.0, abs=1e-3)
    # every ratio is ~1 >= the threshold 0.01: each weight is 0.01, so the gradient is 0.01 times the plain one
    tis = norm("algorithm.rollout_is=token", "algorithm.rollout_is_threshold=0.01")
    assert tis["rollout_corr/is_mean"] == pytest.approx(0.01)
    assert tis["actor/grad_norm"] == pytest.approx(0.01 * plain["actor/grad_norm"], rel=1e-3)
    # masked IS with bounds that exclude ratio 1: every token leaves the loss, nothing is learnt
    masked = norm(
        "algorithm.rollout_rs=token", "algorithm.rollout_rs_lower=1.5", "algorithm.rollout_rs_upper=2"
    )
    assert masked["rollout_corr/rs_masked_fraction"] == 1.0 and masked["actor/grad_norm"] == 0.0
    kept = norm("algorithm.rollout_rs=geometric", "algorithm.rollout_rs_lower=0.5")
    assert kept["rollout_corr/rs_masked_fraction"] == 0.0
    assert kept["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-4)
    # verl's criteria, chained: k1 bounds [1.5, 2] on pi_rollout / pi_train exclude ratio 1 -> nothing learnt;
    # a k3 bound alone keeps everything (k3 ~ 0)
    dropped = norm("algorithm.rollout_rs='seq_max_k3,token_k1'", "algorithm.rollout_rs_threshold='0.1,1.5_2'")
    assert dropped["rollout_corr/rs_token_k1_masked_fraction"] == 1.0 and dropped["actor/grad_norm"] == 0.0
    kept = norm("algorithm.rollout_rs=seq_max_k3", "algorithm.rollout_rs_threshold=0.1")
    assert kept["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-4)
    # bypass mode: no trainer forward for the old log-probs; the loss corrects on pi_current / pi_rollout.
    # ppo_clip at ratio ~1 is plain PPO; reinforce's gradient -A grad logp equals PPO's at ratio 1, and
    # truncating every weight at .01 scales it by .01
    bypass = norm("algorithm.policy_loss_mode=bypass_mode")
    assert bypass["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-3)
    reinforce = norm("algorithm.policy_loss_mode=bypass_mode", "algorithm.loss_type=reinforce")
    assert reinforce["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-3)
    truncated = norm(
        "algorithm.policy_loss_mode=bypass_mode", "algorithm.loss_type=reinforce",
        "algorithm.rollout_is=token", "algorithm.rollout_is_threshold=0.01",
    )  # fmt: skip
    assert truncated["actor/rollout_corr/is_mean"] == pytest.approx(0.01)
    assert "rollout_corr/is_mean" not in truncated  # no step-level correction in bypass mode
    assert truncated["actor/grad_norm"] == pytest.approx(0.01 * plain["actor/grad_norm"], rel=1e-3)


@pytest.mark.slow
def test_ppo_with_critic_warmup_checkpoint_and_resume(tiny_model, dist_group, tmp_path, spy):
    from infra.checkpoint import layout as layout
    from train import checkpoint as ckpt
    from train.stages.grpo import GRPOTrainer

    over = ["algorithm.adv_estimator=gae", "algorithm.lam=0.9", "critic.warmup_steps=1", "save_every=1",
            "critic.lr=1e-3"]  # fmt: skip
    seen = spy("gae")
    trainer = GRPOTrainer(_cfg(tiny_model, tmp_path, *over))
    first = trainer.step(1)
    assert first["actor/updates"] == 0 and first["critic/grad_norm"] > 0  # warm-up: critic only
    second = trainer.step(2)
    assert second["actor/updates"] == 1 and math.isfinite(second["critic/vf_loss"])
    assert seen[0].values is not None and seen[0].values.shape == seen[0].response_mask.shape
    assert not torch.equal(seen[0].values, seen[1].values)  # the critic learnt between the steps
    trainer.save(2)
    saved = {k: v.clone() for k, v in trainer.critic.full_weights()}
    trainer.close()
    latest = layout.latest_checkpoint(tmp_path / "run")
    assert (latest / layout.CRITIC / ".metadata").is_file()  # the value model's own DCP shards
    assert "critic_scheduler" in ckpt.load_trainer_state(latest)
    resumed = GRPOTrainer(_cfg(tiny_model, tmp_path, *over, "resume=true", "total_steps=3"))
    assert resumed.start_step == 2
    for k, v in resumed.critic.full_weights():
        assert torch.equal(v, saved[k]), k
    assert resumed.critic.optimizer.state  # Adam moments restored, not fresh
    resumed.close()
    with pytest.raises(ckpt.CheckpointError, match="no critic/"):
        ckpt.restore_critic(tmp_path, None, {})
