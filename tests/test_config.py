import pytest

from orchestration.train_cli import main
from train.config import ConfigError, build_config


def test_defaults_and_overrides_are_typed():
    cfg = build_config(overrides=["optim.lr=1e-5", "rollout.n=8"])
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.rollout.n == 8


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("optim.lrr=3", "lrr"),
        ("rollout.n=abc", "abc"),
        ("rollout.n=0", "rollout.n"),
        ("algorithm.clip_ratio_c=0.5", r"algorithm.clip_ratio_c=0.5 must be > 1"),
        ("keep_last=-1", r"keep_last=-1 must be >= 1"),
        ("keep_last=0", r"keep_last=0 must be >= 1"),
        ("save_every=-3", r"save_every=-3 must be >= 0"),
        ("val_every=-1", r"val_every=-1 must be >= 0"),
        (
            "algorithm.adv_estimator=grpoo",
            r"algorithm.adv_estimator='grpoo' is not registered \(known: .*rloo",
        ),
        ("algorithm.policy_loss_mode=clip", r"algorithm.policy_loss_mode='clip' is not registered"),
        ("algorithm.loss_agg_mode=token_mean", r"algorithm.loss_agg_mode='token_mean' \(known: token-mean"),
        ("algorithm.kl_loss_type=k4", r"algorithm.kl_loss_type='k4'"),
        ("algorithm.gamma=2", r"algorithm.gamma=2.0 must be in \[0, 1\]"),
        ("algorithm.token_level_classmate_reward_mode=some", "must be one of classmate_partial, all"),
        ("optim.schedule=linear", "optim.schedule='linear' must be one of constant, cosine"),
        ("reward._target_=nope.Nope", r"reward._target_=nope.Nope: no module 'nope'"),
        ("reward._target_=train.rewards.math_reward.Nope", r"train.rewards.math_reward has no 'Nope'"),
        (
            "reward.timeout=3",
            r"reward.timeout: MathReward takes no argument 'timeout' \(its arguments: .*timeout_s",
        ),
        ("rollout.engine.kv_cache=2", r"rollout.engine.kv_cache: VLLMEngine takes no argument"),
        (
            "algorithm.adv_estimator=gdpo",
            r"adv_estimator=gdpo needs the reward signal classmate_scores, which MathReward does not provide: "
            r"use reward._target_=train.rewards.classmate_reward.ClassmateReward",
        ),
        ("policy.precision=fp8", "precision"),
        ("data.prompts_per_step=6", "ppo_mini_batch_size"),
        ("noequals", "key=value"),
    ],
)
def test_bad_values_fail_with_the_key_named(override, fragment):
    extra = ["algorithm.ppo_mini_batch_size=4"] if override.startswith("data.prompts") else []
    with pytest.raises(ConfigError, match=fragment):
        build_config(overrides=[override, *extra])


EMBEDDING = "train.diversity.judges.EmbeddingJudge"


def test_component_arguments_bound_against_the_signature():
    with pytest.raises(
        ConfigError, match=r"reward: ClassmateReward needs argument 'classmates': add reward.classmates="
    ):
        build_config(overrides=["reward._target_=train.rewards.classmate_reward.ClassmateReward"])
    with pytest.raises(ConfigError, match=r"reward.judge.judge.thresh: EmbeddingJudge takes no argument"):
        build_config("darling_math", [f"reward.judge.judge={{_target_: {EMBEDDING}, thresh: 0.5}}"])
    # the engine's model path, dtype, ... come from the trainer, not the config
    build_config(overrides=["rollout.engine._target_=train.rollout.hf_engine.HFEngine"])
    cfg = build_config("classmate_sycophancy", ["algorithm.adv_estimator=grpo_w_classmate"])
    assert cfg.algorithm.token_level_classmate_reward_mode == "classmate_partial"


def test_every_experiment_and_preset_validates():
    from train.config import EXPERIMENTS_DIR, load_experiment

    for path in sorted(EXPERIMENTS_DIR.glob("*.yaml")):
        exp = load_experiment(path.stem)
        if exp.get("stages") or exp.get("for_stage"):
            continue  # tests/test_pipeline.py plans the staged ones and the stage bases they name
        build_config(path.stem)
        for preset in exp.get("presets", {}) or {}:
            build_config(path.stem, preset=preset)


def test_cli_validate_one_line(capsys):
    assert main(["experiment=darling_math", "--validate"]) == 0
    assert capsys.readouterr().out.startswith("config ok: darling_math")
    assert main(["keep_last=-1", "--validate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bad config value: keep_last=-1 must be >= 1 (or null = keep all)"]
    assert main(["reward._target_=nope.Nope", "--validate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: reward._target_=nope.Nope: no module 'nope'")


def test_cli_help_lists_the_configured_components_and_knobs(capsys):
    # darling_math's answer-aware judge has no inner judge (one-number answers); give it MiniLM here
    assert main(["experiment=darling_math", f"reward.judge.judge={{_target_: {EMBEDDING}}}", "--help"]) == 0
    out = capsys.readouterr().out
    assert "reward._target_=train.rewards.darling_reward.DarlingReward" in out
    assert "reward.combine='multiplicative'" in out and "reward.judge.judge.threshold=0.7" in out
    assert "algorithm.gamma=1.0" in out and "[reinforce_plus_plus, gae]" in out
    assert "reward.lambda_d=1.0" in out  # a default the experiment file does not set


def test_unknown_experiment_names_the_known_ones():
    with pytest.raises(ConfigError, match="unknown experiment 'nope'"):
        build_config("nope")


def test_swapping_a_component_drops_the_old_kwargs():
    cfg = build_config(overrides=["reward._target_=tests.rewards_for_tests.VowelShareReward"])
    assert dict(cfg.reward) == {"_target_": "tests.rewards_for_tests.VowelShareReward"}


def test_cli_help_lists_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.loss_agg_mode" in out and "rollout.n=4" in out


def test_cli_bad_value_is_one_line_error(capsys):
    assert main(["rollout.temperature=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rollout.temperature" in err[0]


def test_cli_missing_model_path_is_one_line_error(capsys, tmp_path):
    assert main([f"model.path={tmp_path / 'nothing'}", "track=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.path" in err[0]
