"""The config's layers and their merge: base defaults <- experiment `config:` <- preset <- `key=value`
overrides, a replaced component's old arguments dropped, secrets refused."""

from __future__ import annotations

import contextlib

from omegaconf import DictConfig, OmegaConf

from train.config.errors import ConfigError
from train.config.experiments import load_experiment
from train.config.schema import TrainConfig, train_schema
from train.config.validate import ENGINE_SUPPLIED, validate, validate_components, validate_run


def split_cli(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """`experiment=X preset=Y key=value ...` -> (experiment, preset, the overrides), as every CLI takes them."""
    experiment = preset = None
    overrides = []
    for arg in argv:
        if arg.startswith("experiment="):
            experiment = arg.split("=", 1)[1]
        elif arg.startswith("preset="):
            preset = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return experiment, preset, overrides


def build_config(
    experiment: str | None = None, overrides: list[str] | None = None, preset: str | None = None
) -> DictConfig:
    """Base defaults <- experiment `config:` <- experiment `presets.<preset>` <- `key=value` overrides."""
    layers = []
    if experiment:
        exp = load_experiment(experiment)
        layers.append(OmegaConf.create({"experiment": experiment}))
        layers.append(exp.get("config", OmegaConf.create()))
        if preset:
            layers.append(_preset(preset, exp.get("presets", {})))
    elif preset:
        layers.append(_preset(preset, {}))
    layers.extend(override_layers(overrides or []))
    # Run keys and components first, on an untyped merge: their errors come before the method table
    # (and torch) is imported to type the `algorithm` knobs.
    untyped = merge_layers(
        OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(TrainConfig))), layers
    )
    with contextlib.suppress(TypeError):  # a badly typed value: the typed merge below names it
        validate_run(untyped)
    validate_components(untyped, ENGINE_SUPPLIED)
    cfg = merge_layers(OmegaConf.structured(train_schema()), layers)
    validate(cfg)
    return cfg


def override_layers(overrides: list[str]) -> list[DictConfig]:
    """`key=value` strings -> one config layer each (in order)."""
    layers = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"bad override {item!r}: expected key=value (python -m train --help lists the keys)"
            )
        layers.append(OmegaConf.from_dotlist([item]))
    return layers


def merge_layers(cfg: DictConfig, layers: list) -> DictConfig:
    """Merge layers onto a structured config in order; a bad key or type is a ConfigError naming the key.

    Shared by every config schema (GRPO here, the SFT/DPO stages in train/stages/).
    """
    try:
        for layer in layers:
            cfg = OmegaConf.merge(_drop_replaced_components(cfg, layer), layer)
    except Exception as exc:  # omegaconf's messages name the key; keep the first line
        key = getattr(exc, "full_key", None)
        where = f" for {key}" if key else ""
        raise ConfigError(f"bad config value{where}: {str(exc).splitlines()[0]}") from exc
    refuse_secrets(cfg)
    return cfg


def refuse_secrets(cfg: DictConfig) -> None:
    """A config is written to sweep files, config.yaml and MLflow, so it must not hold a key."""
    from infra.redact import secrets_in

    found = secrets_in(OmegaConf.to_container(cfg, resolve=False))
    if found:
        raise ConfigError(
            f"{', '.join(found)} holds a secret (an API key, token or password); configs are written to "
            "disk and MLflow, so keys come only from the environment: export it and name the variable "
            f"instead, e.g. {found[0].rsplit('.', 1)[0] + '.' if '.' in found[0] else ''}api_key_env=MY_KEY"
        )


def _preset(name: str, experiment_presets) -> DictConfig:
    """An experiment's own preset, else an algorithm preset (grpo, dr_grpo) from train.algorithms.presets."""
    from train.algorithms.presets import PRESETS

    if name in experiment_presets:
        return experiment_presets[name]
    if name in PRESETS:
        return OmegaConf.create({"algorithm": dict(PRESETS[name])})
    known = sorted(set(experiment_presets) | set(PRESETS))
    raise ConfigError(f"unknown preset {name!r} (known: {', '.join(known)})")


SWAPPABLE = ("reward", "reward.judge", "reward.quality", "rollout.engine")  # nested ones: DARLING's parts


def _drop_replaced_components(cfg: DictConfig, layer: DictConfig) -> DictConfig:
    """A layer naming a new `_target_` replaces the whole component dict (old kwargs would not fit)."""
    for path in SWAPPABLE:
        new = OmegaConf.select(layer, f"{path}._target_", default=None)
        if new is not None and new != OmegaConf.select(cfg, f"{path}._target_", default=None):
            OmegaConf.update(cfg, path, {}, merge=False)
    return cfg
