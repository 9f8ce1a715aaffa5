"""Configs the tests build as the command line does: a stage's own schema with overrides, and a small GRPO
run on the tiny model with the HF engine (no vLLM, no tracking)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from train.config import build_config, merge_layers, override_layers


def stage_config(stage, model: Path, run_dir: Path, *overrides: str) -> DictConfig:
    """`stage`'s schema (SFT, DPO, ...) with the model, the run folder and `overrides`, validated by the stage."""
    cfg = merge_layers(
        OmegaConf.structured(stage.schema),
        override_layers([f"model.path={model}", f"run_dir={run_dir}", *overrides]),
    )
    stage.validate(cfg)
    return cfg


def hf_grpo_config(model: Path, run_dir: Path, run_name: str, *overrides: str) -> DictConfig:
    """A GRPO run named `run_name` on `model` with the HF generate engine and no MLflow, plus `overrides`."""
    cfg = build_config(
        overrides=[
            f"model.path={model}", f"run_dir={run_dir}", "track=false",
            "rollout.engine._target_=train.rollout.hf_engine.HFEngine", *overrides,
        ]
    )  # fmt: skip
    cfg.run_name = run_name
    return cfg
