"""The config's layers and their merge: base defaults <- experiment `config:` <- preset <- `key=value`
overrides, a replaced component's old arguments dropped, secrets refused."""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any

from omegaconf import DictConfig, OmegaConf

from train.config.errors import KEYS_HINT, ConfigError, explain, first_line, reported
from train.config.experiments import FAST_LOADER, check_shape, load_experiment
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
        layers.append(exp.get("config") or OmegaConf.create())
        if preset:
            layers.append(_preset(preset, exp.get("presets") or {}))
    elif preset:
        layers.append(_preset(preset, {}))
    layers.extend(override_layers(overrides or []))
    untyped = merge_layers(OmegaConf.create(_untyped_defaults()), layers)
    # A preview on the untyped merge: the run keys' and components' errors come before the method table (and
    # torch) is imported to type the `algorithm` knobs. A value of the wrong shape (a number for a section)
    # can break it; the typed merge below names that one.
    with contextlib.suppress(TypeError, AttributeError, KeyError):
        validate_run(untyped)
        validate_components(untyped, ENGINE_SUPPLIED)
    cfg = merge_layers(_typed_defaults(), layers)
    validate(cfg)
    return cfg


@functools.cache
def _untyped_defaults() -> dict:
    """TrainConfig's defaults as plain containers (OmegaConf.create copies them; built once: it is slow)."""
    return OmegaConf.to_container(OmegaConf.structured(TrainConfig))


def _typed_defaults() -> DictConfig:
    """A fresh `OmegaConf.structured(train_schema())` (merging edits it), copied from one built per method
    table: a copy takes a tenth of the time."""
    from train.algorithms.registry import knobs

    return copy.deepcopy(_structured_schema(tuple((name, repr(knob)) for name, knob in knobs().items())))


@functools.lru_cache(maxsize=4)
def _structured_schema(_knobs: tuple) -> DictConfig:
    """The structured GRPO schema of one set of registered knobs (`_knobs`: their key)."""
    return OmegaConf.structured(train_schema())


def override_layers(overrides: list[str]) -> list[DictConfig]:
    """`key=value` strings -> one config layer each (in order)."""
    return [parse_override(item) for item in overrides]


def parse_override(item: str) -> DictConfig:
    """One `key=value` -> its one-key config layer, or a ConfigError naming the override and the fix."""
    key, sep, text = item.partition("=")
    key = key.strip()
    bare = key.lstrip("+~")
    if bare != key:
        raise ConfigError(
            f"bad override {_shown(item)}: Hydra's +, ++ and ~ prefixes are not taken here (every key exists and "
            f"none is removed): set it as {bare or 'optim.lr'}={text.strip() or 'null'}"
        )
    if not sep:
        raise ConfigError(f"bad override {_shown(item)}: expected key=value ({KEYS_HINT})")
    if "" in key.split("."):
        what = f"the key {_shown(key)} has an empty part" if key else "no key before '='"
        raise ConfigError(f"bad override {_shown(item)}: {what}; write a dotted key, e.g. optim.lr=1e-5")
    value = parse_value(text, f"bad override {_shown(item)}")
    if value == "???":  # OmegaConf's "no value": merged, it would leave the key as it was, in silence
        raise ConfigError(f"bad override {_shown(item)}: ??? means no value; give {key} a value (or null)")
    layer = OmegaConf.create()
    with reported(key):
        OmegaConf.update(layer, key, value)
    return layer


def parse_value(text: str, where: str) -> Any:
    """A `key=value` override's value as OmegaConf's YAML loader reads it (1e-6 a float, [a,b] a list), or
    a ConfigError starting with `where` (what was given: an override, a sweep's --grid value)."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    try:
        check_shape(yaml.load(text, Loader=FAST_LOADER), where)  # before the slow loader recurses
        return yaml.load(text, Loader=get_yaml_loader())
    except ConfigError:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: an int of 5,000 digits
        problem = getattr(exc, "problem", None) or first_line(exc, 80)
        raise ConfigError(
            f"{where}: the value {_shown(text)} is not valid YAML ({problem}); quote it to give it as text "
            "(in a shell: key=\"'...'\") or close its brackets"
        ) from None


def _shown(text: str, limit: int = 80) -> str:
    """A user's text quoted for an error line: repr (no raw newline), cut to `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def merge_layers(cfg: DictConfig, layers: list, resolve: bool = True) -> DictConfig:
    """Merge layers onto a structured config in order (in place: `cfg` is the caller's fresh base), then
    (`resolve`) check that every ${...} resolves to a value of its key's type and no key is ???, here rather
    than at first use. A bad key, type or interpolation is a ConfigError naming the key. Shared by every
    config schema (GRPO here, the SFT/DPO stages in train/stages/).
    """
    for layer in layers:
        try:
            _drop_replaced_components(cfg, layer).merge_with(layer)
        except Exception as exc:  # noqa: BLE001 - omegaconf's, named by key; a merge error carries none
            raise explain(exc, getattr(exc, "full_key", None) or _culprit(cfg, layer)) from None
    refuse_secrets(cfg)
    if resolve:
        check_resolves(cfg)
    return cfg


def check_resolves(cfg: DictConfig) -> None:
    """Every ${...} resolves to a value of its key's type and no key is ??? (a ConfigError naming the key)."""
    with reported():
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def _culprit(cfg: DictConfig, layer: DictConfig) -> str:
    """The dotted key of `layer` whose merge onto `cfg` fails (on the error path only: each key merged alone)."""
    path: list[str] = []
    node = OmegaConf.to_container(layer, resolve=False)
    while isinstance(node, dict):
        for key, value in node.items():
            trial = {key: value}
            for outer in reversed(path):
                trial = {outer: trial}
            try:
                OmegaConf.merge(cfg, trial)
            except Exception:  # noqa: BLE001 - the one that fails
                path.append(str(key))
                node = value
                break
        else:
            break
    return ".".join(path)


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
        with reported():  # a preset that is itself a ${...}
            layer = experiment_presets[name]
        if not isinstance(layer, DictConfig):
            raise ConfigError(
                f"presets.{name} is {_shown(str(layer), 40)}, not a mapping of keys (e.g. optim: {{lr: 1e-5}})"
            )
        return layer
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
