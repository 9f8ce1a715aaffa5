import pytest

from train.__main__ import main
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
        ("algorithm.clip_ratio_c=0.5", "clip_ratio_c"),
        ("policy.precision=fp8", "precision"),
        ("data.prompts_per_step=6", "ppo_mini_batch_size"),
        ("noequals", "key=value"),
    ],
)
def test_bad_values_fail_with_the_key_named(override, fragment):
    extra = ["algorithm.ppo_mini_batch_size=4"] if override.startswith("data.prompts") else []
    with pytest.raises(ConfigError, match=fragment):
        build_config(overrides=[override, *extra])


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
