"""Everything about a config that can be known before a model loads, one line per error: the declared
ranges, the components' signatures, the engine's own checks and the trainer's keys (train/config/env.py
checks `env.*`, train/config/algorithm.py the method)."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from train.config.algorithm import validate_algorithm
from train.config.env import validate_env
from train.config.errors import ConfigError, fail_first
from train.config.schema import TRAINERS, RunConfig, TrainConfig


def check_fields(cfg: DictConfig, schema: type, prefix: str = "") -> None:
    """The ranges and choices declared beside each field (`checked`), nested configs included."""
    for f in dataclasses.fields(schema):
        knob = f.metadata.get("knob")
        value = cfg.get(f.name) if f.name in cfg else None
        if knob is not None:
            problem = knob.problem(value)
            if problem:
                note = f" ({knob.doc})" if knob.doc else ""
                raise ConfigError(f"bad config value: {prefix}{f.name}={value!r} {problem}{note}")
        elif f.default_factory is not dataclasses.MISSING and isinstance(value, DictConfig):
            default = f.default_factory()
            if dataclasses.is_dataclass(default):
                check_fields(value, type(default), f"{prefix}{f.name}.")


def validate_run(cfg: DictConfig, schema: type = RunConfig) -> None:
    """The keys every loop shares (RunConfig, or `schema`): their declared ranges and choices."""
    check_fields(cfg, schema)
    lora = cfg.policy.lora
    if lora.rank > 0 and not lora.target_modules:
        raise ConfigError(
            "bad config value: policy.lora.target_modules=[] with policy.lora.rank > 0: name the modules "
            "that get adapters, e.g. [q_proj,v_proj] or [all-linear]"
        )


def validate_components(cfg: DictConfig, supplied: dict[str, set[str]] | None = None) -> None:
    """Every `_target_` exists and its keyword arguments fit its signature."""
    from train.components import ComponentError, check

    try:
        check(OmegaConf.to_container(cfg, resolve=True), supplied)
    except ComponentError as exc:
        raise ConfigError(str(exc)) from None


def _engine_supplied() -> dict[str, set[str]]:
    """The arguments the trainer gives every rollout engine (the config need not)."""
    from train.rollout.base import ENGINE_ARGS

    return {"rollout.engine": set(ENGINE_ARGS)}


ENGINE_SUPPLIED = _engine_supplied()


def validate_engine(cfg: DictConfig) -> None:
    """`rollout.engine`: the trainer gives it the weights, and the engine's own checks pass (its class's
    `check_settings`, with its constructor's arguments as configured or defaulted)."""
    import inspect

    from train.components import HYDRA_KEYS, ComponentError, load_target

    node = OmegaConf.to_container(cfg.rollout.engine, resolve=True)
    if "model_path" in node:
        raise ConfigError(
            "rollout.engine.model_path: the trainer gives the engine the policy's weights; set model.path"
        )
    try:
        engine = load_target("rollout.engine", node["_target_"])
    except ComponentError as exc:
        raise ConfigError(str(exc)) from None
    check = getattr(engine, "check_settings", None)
    if check is None:
        return
    bound = inspect.signature(engine).bind_partial(**{k: v for k, v in node.items() if k not in HYDRA_KEYS})
    bound.apply_defaults()
    try:
        check(world_size=cfg.world_size, **bound.arguments)
    except ValueError as exc:
        raise ConfigError(f"bad config value: {exc}") from None


def validate(cfg: DictConfig) -> None:
    """Everything about a GRPO config that can be known before a model loads; one line per error."""
    validate_run(cfg, TrainConfig)
    validate_components(cfg, ENGINE_SUPPLIED)
    checks = [
        (
            cfg.data.prompts_per_step % cfg.world_size == 0,
            "data.prompts_per_step must be divisible by world_size",
        ),
    ]
    checks += _cs336_checks(cfg)
    mini = cfg.algorithm.ppo_mini_batch_size
    if mini is not None:
        checks.append(
            (
                mini > 0 and cfg.data.prompts_per_step % mini == 0,
                "algorithm.ppo_mini_batch_size must divide data.prompts_per_step",
            )
        )
    fail_first(checks)
    validate_env(cfg)
    validate_engine(cfg)
    validate_algorithm(cfg.algorithm, cfg.reward._target_, cfg)


def _cs336_checks(cfg: DictConfig) -> list[tuple[bool, str]]:
    """The prompt template's, the trainer's and expert iteration's keys."""
    from data_prep.prompt_templates import TEMPLATES
    from train.components import class_constant

    ei, template = cfg.ei, cfg.data.prompt_template
    provides = class_constant(cfg.reward._target_, "provides_signals") or ()
    return [
        (
            template is None or template in TEMPLATES,
            f"data.prompt_template={template!r} is not one of {sorted(TEMPLATES)} (or null: the chat template)",
        ),
        (cfg.trainer in TRAINERS, f"trainer={cfg.trainer!r} is not one of {list(TRAINERS)}"),
        (ei.sft_epochs >= 1, "ei.sft_epochs must be >= 1"),
        (
            ei.batch_size >= 1 and ei.batch_size % cfg.world_size == 0,
            "ei.batch_size must be >= 1 and divisible by world_size",
        ),
        (
            ei.loss_normalization in ("token_mean", "sequence_constant"),
            "ei.loss_normalization must be token_mean or sequence_constant",
        ),
        (ei.normalize_constant > 0, "ei.normalize_constant must be > 0"),
        (
            cfg.trainer != "expert_iteration" or cfg.optim.schedule == "constant",
            "trainer=expert_iteration takes optim.schedule=constant (its optimizer steps per round vary)",
        ),
        (
            not (cfg.trainer == "expert_iteration" and ei.require_format) or "format" in provides,
            f"ei.require_format=true needs a reward that reports the format ({cfg.reward._target_} does not): "
            "use reward._target_=train.rewards.r1_zero_reward.R1ZeroReward",
        ),
    ]
