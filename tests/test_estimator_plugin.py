"""Issue 13: an advantage estimator with its own knob is one file, this one. It registers itself, its knob
becomes `algorithm.toy_scale` (typed, range-checked, in --help), and the GRPO trainer trains with it
without naming it."""

from __future__ import annotations

import pytest
import torch

from tests.configs import hf_grpo_config
from train.algorithms.registry import AdvantageContext, AdvantageOutput, Knob, register_adv_estimator
from train.config import ConfigError, build_config

CALLS: list[dict] = []


def toy_sign(cfg, ctx: AdvantageContext) -> AdvantageOutput:
    """+scale on every token of a response above its group's mean score, -scale below, 0 at it."""
    ids = torch.unique(ctx.group_index, return_inverse=True)[1]
    sums = torch.zeros(int(ids.max()) + 1).scatter_add_(0, ids, ctx.scores)
    counts = torch.zeros(int(ids.max()) + 1).scatter_add_(0, ids, torch.ones_like(ctx.scores))
    adv = cfg.toy_scale * torch.sign(ctx.scores - (sums / counts)[ids]).unsqueeze(-1) * ctx.response_mask
    CALLS.append({"scale": cfg.toy_scale, "adv": adv})
    return AdvantageOutput(adv, {"toy_positive_share": float((adv > 0).any(-1).float().mean())})


@pytest.fixture(autouse=True, scope="module")
def _toy_estimator_registered():
    """Registered for this module's tests only: the table is process-wide, and a knob left behind would be
    written into other tests' stage configs, which their subprocesses (without this module) reject."""
    from train.algorithms import registry

    register_adv_estimator(
        "toy_sign",
        knobs={"toy_scale": Knob(1.0, "size of the toy advantage", float, valid=lambda x: x > 0, rule="> 0")},
    )(toy_sign)
    yield
    registry.ADV_ESTIMATORS.pop("toy_sign", None)


def test_toy_knob_is_a_typed_checked_config_key(capsys):
    from orchestration.train_cli import main

    assert build_config(overrides=["algorithm.adv_estimator=toy_sign"]).algorithm.toy_scale == 1.0
    with pytest.raises(ConfigError, match=r"algorithm.toy_scale=-2.0 must be > 0"):
        build_config(overrides=["algorithm.adv_estimator=toy_sign", "algorithm.toy_scale=-2"])
    with pytest.raises(ConfigError, match="toy_scale"):
        build_config(overrides=["algorithm.toy_scale=big"])
    assert main(["--help"]) == 0
    assert "algorithm.toy_scale=1.0" in capsys.readouterr().out


@pytest.mark.slow
def test_trains_a_step_with_the_toy_estimator(tiny_model, dist_group, tmp_path):
    from train.stages.grpo import GRPOTrainer

    cfg = hf_grpo_config(
        tiny_model, tmp_path / "run", "toy", "total_steps=1", "algorithm.adv_estimator=toy_sign",
        "algorithm.toy_scale=0.5", "data.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=8",
        "data.builtin_size=16", "optim.lr=1e-3", "reward._target_=tests.rewards_for_tests.VowelShareReward",
    )  # fmt: skip
    CALLS.clear()
    trainer = GRPOTrainer(cfg)
    before = {k: v.clone() for k, v in trainer.policy.full_weights()}
    metrics = trainer.train()
    trainer.close()
    assert len(CALLS) == 1 and CALLS[0]["scale"] == 0.5
    assert set(CALLS[0]["adv"].unique().tolist()) <= {-0.5, 0.0, 0.5}
    assert 0.0 <= metrics["advantage/toy_positive_share"] <= 1.0
    after = dict(trainer.policy.full_weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the toy advantages trained it
