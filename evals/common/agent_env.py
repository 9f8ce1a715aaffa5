"""The `env.*` section an eval's answers with tools (`--tools`) run under: the training run's own.

A checkpoint is evaluated with the environment it was trained in (tool format, interaction, turn and token
budgets, timeouts: the `env` section of its run folder's config.yaml), with `--tools` replacing only the
tools and `--max-turns`, when given, the turns. The result goes through the training config's schema and
checks (train/config/schema.py EnvConfig, train/config/env.py validate_env) and the training rollout's
builder (train/env/registry.py build_agent, in evals/common/generation.py), so a bad `--tools` is the
one-line error a bad `env.tools` is in training, and a run trained with `env.tool_format=fallback` is not
evaluated with `auto`. A bare model folder (no run around it) gets the schema's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evals.common.cli import EvalError
from infra.checkpoint import layout as ckpt

RUN_CONFIG = "config.yaml"  # what train/loop.py writes in a run folder: the run's whole config


def run_config_of(checkpoint: str | Path | None) -> Path | None:
    """The config.yaml of the training run a checkpoint (its step folder or its hf/) belongs to, or None."""
    if checkpoint is None:
        return None
    step = ckpt.checkpoint_of(checkpoint)
    if step is None:
        return None
    path = step.parent.parent / RUN_CONFIG  # <run_dir>/checkpoints/step_N
    return path if path.is_file() else None


def trained_env(config_path: Path | None) -> dict[str, Any] | None:
    """The `env` section of a run's config.yaml (interpolations resolved against the whole config), or None
    when the run has none; an unreadable file is an EvalError naming it."""
    if config_path is None:
        return None
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(config_path)
        env = cfg.get("env")
        return None if env is None else OmegaConf.to_container(env, resolve=True)
    except Exception as exc:  # noqa: BLE001 - yaml's or omegaconf's: the file is named either way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EvalError(f"cannot read the training config {config_path}: {first}") from None


def agent_env(tools: str, max_turns: int | None = None, checkpoint: str | Path | None = None) -> dict:
    """The `env.*` dict for `build_agent`: the checkpoint's training env (or the defaults), tools = `tools`
    (a comma list of names or `_target_`s, as `env.tools`), max_turns = `max_turns` when not None; checked
    by the training config's checks. A bad value is an EvalError of one line naming `--tools` and the key."""
    from omegaconf import OmegaConf

    from train.config import ConfigError, EnvConfig, TrainConfig, check_fields, merge_layers, validate_env

    source = run_config_of(checkpoint)
    env = trained_env(source)
    override: dict[str, Any] = {"tools": tools}
    if max_turns is not None:
        override["max_turns"] = max_turns
    layers = [OmegaConf.create({"env": layer}) for layer in (env, override) if layer is not None]
    where = f"the training env of {source}" if env is not None else "the default env"
    try:
        cfg = merge_layers(OmegaConf.structured(TrainConfig), layers)
        check_fields(cfg.env, EnvConfig, "env.")
        validate_env(cfg)
    except ConfigError as exc:
        asked = f"--tools {tools!r}" + (f" --max-turns {max_turns}" if max_turns is not None else "")
        raise EvalError(f"{asked} with {where}: {exc}") from None
    return OmegaConf.to_container(cfg.env, resolve=True)
