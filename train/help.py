"""`python -m train [experiment=NAME] --help`: every key with its default and meaning, the method
table's knobs with the entries that use them, and the arguments of the configured `_target_` components
(e.g. DARLING's reward and judge), read from their constructors' signatures."""

from __future__ import annotations

import dataclasses
import inspect
import re

from omegaconf import DictConfig, OmegaConf

from train.config import schema as config_schema


def field_comments() -> dict[tuple[str, str], str]:
    """{(class name, field): the comment beside the field} of train/config/schema.py (on the field's own line, or
    on the closing line of a declaration the formatter wrapped)."""
    comments: dict[tuple[str, str], str] = {}
    current = name = ""
    for line in inspect.getsource(config_schema).splitlines():
        m = re.match(r"class (\w+)", line)
        if m:
            current, name = m.group(1), ""
        m = re.match(r"\s+(\w+): [^=]+= ", line)
        if m:
            name = m.group(1)
        m = re.match(r"\s*[^#\s][^#]*#\s*(.*)$", line)  # code, then a comment
        if m and name and (current, name) not in comments:
            comments[(current, name)] = m.group(1)
    return comments


def _declaring_class(cls: type, name: str) -> str:
    for base in cls.__mro__:
        if name in getattr(base, "__annotations__", {}):
            return base.__name__
    return cls.__name__


def schema_lines(schema: type, prefix: str = "", comments: dict | None = None) -> list[str]:
    """`key=default    # meaning` for every field of a config dataclass, nested ones dotted."""
    from train.algorithms import registry

    comments = field_comments() if comments is None else comments
    knobs = registry.knobs() if prefix == "algorithm." else {}
    lines = []
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            lines.extend(schema_lines(type(default), key + ".", comments))
            continue
        if isinstance(default, dict) and "_target_" in default:
            continue  # components: listed with their arguments below
        if f.name in knobs:
            note = f"{knobs[f.name].doc} [{', '.join(registry.knob_owners(f.name))}]"
        else:
            note = comments.get((_declaring_class(schema, f.name), f.name), "")
        lines.append(f"  {key}={default!r}" + (f"    # {note}" if note else ""))
    return lines


def component_lines(cfg: DictConfig) -> list[str]:
    """Each configured component's `_target_` and constructor arguments (configured value, else default)."""
    from train.components import ComponentError, find, load_target
    from train.rollout.base import ENGINE_ARGS

    lines = []
    for key, node in find(OmegaConf.to_container(cfg, resolve=True)):
        lines.append(f"  {key}._target_={node['_target_']}")
        try:
            params = inspect.signature(load_target(key, node["_target_"])).parameters.values()
        except (ComponentError, TypeError, ValueError) as exc:
            lines.append(f"    (cannot list its arguments: {exc})")
            continue
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self":
                continue
            if isinstance(node.get(p.name), (dict, list)) and "_target_" in str(node.get(p.name)):
                continue  # a nested component: its own lines follow
            value = node.get(p.name, "<required>" if p.default is p.empty else p.default)
            if key == "rollout.engine" and p.name in ENGINE_ARGS and p.name not in node:
                value = f"<{ENGINE_ARGS[p.name]}>"  # given by the trainer (train/loop.py engine_spec)
            lines.append(f"  {key}.{p.name}={value!r}")
    return lines


def describe(cfg: DictConfig | None = None) -> str:
    """The option list; with `cfg` (an experiment's config) its components' arguments as configured."""
    from train.algorithms import registry

    cfg = cfg if cfg is not None else OmegaConf.structured(config_schema.train_schema())
    registry.load_entries()
    parts = schema_lines(config_schema.train_schema())
    parts.append("")
    parts.append(
        "Advantage estimators (algorithm.adv_estimator): " + ", ".join(sorted(registry.ADV_ESTIMATORS))
    )
    parts.append("Policy losses (algorithm.policy_loss_mode): " + ", ".join(sorted(registry.POLICY_LOSSES)))
    parts.append("")
    parts.append("Components (`_target_` + keyword arguments; a new `_target_` drops the old arguments):")
    parts.extend(component_lines(cfg))
    return "\n".join(parts)
