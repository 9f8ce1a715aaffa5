"""Every setting has one key and one default, and no key is accepted then ignored (issue 23).

Walks every key `python -m train --help` lists, sets it to a value other than its default, and checks that
either the config refuses it (one line naming the key) or the value arrives where it is used: in the built
config at that key, for the rollout engine's keys in the arguments the engine is built with (the trainer's
own arguments must not overwrite them), and for every other key in code that reads it (an attribute,
argument or keyword of that name in train/ outside the config's own declaration and help).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from omegaconf import OmegaConf

from train.config import ConfigError, build_config

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^  ([\w.]+)=(.*?)(\s{4}#.*)?$")


def help_keys() -> dict[str, str]:
    """{key: default as printed} of `python -m train --help`."""
    from train.help import describe

    return {m.group(1): m.group(2) for m in map(LINE.match, describe().splitlines()) if m}


def _candidates(default: str) -> list[str]:
    """Values other than the default, likeliest valid first."""
    try:
        value = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        value = default
    if isinstance(value, bool):
        return [str(not value).lower()]
    if isinstance(value, int):
        return [str(v) for v in (value + 1, value + 2, value - 1, 0, 1) if v != value]
    if isinstance(value, float):
        return [repr(v) for v in (value / 2 if value else 0.25, value + 0.5, 1.0, 0.0) if v != value]
    if value is None:
        return ["1", "0.5", "true", "token", "builtin:arithmetic", "something"]
    if isinstance(value, dict):
        return []  # a dict of free keys (tags): set below as tags.<key>
    if isinstance(value, list):  # a list of names (policy.lora.target_modules): a shorter one
        return [f"[{value[0]}]" if value else "[x]"]
    return [f"{value}_other", "something"]


def _read_names() -> set[str]:
    """Attribute, argument, keyword and subscript names the code reads (train/, outside config/help)."""
    names: set[str] = set()
    for path in (ROOT / "train").rglob("*.py"):
        if path.name in ("config.py", "help.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                names.add(str(node.slice.value))
    return names


def _arrived(cfg, key: str, raw: str) -> bool:
    want = OmegaConf.select(
        OmegaConf.create(OmegaConf.to_yaml(OmegaConf.from_dotlist([f"{key}={raw}"]))), key
    )
    got = OmegaConf.select(cfg, key)
    return got == want or str(got) == str(want)  # a str key given 1 holds "1"


def test_every_help_key_arrives_where_it_is_used_or_is_refused():
    from train.loop import engine_spec

    keys = help_keys()
    assert len(keys) > 100, "the --help listing was not parsed"
    read = _read_names()
    arrived, refused, unused = [], [], []
    for key, default in keys.items():
        leaf = key.rsplit(".", 1)[1] if "." in key else key
        values = _candidates(default) if key != "tags" else []
        overrides = [[f"{key}={v}"] for v in values] or [["tags.walk=yes"]]
        for override in overrides:
            try:
                cfg = build_config(overrides=override)
            except ConfigError:
                continue
            set_key, raw = override[0].split("=", 1)
            assert _arrived(cfg, set_key, raw), (
                f"{override[0]} was accepted but the config holds another value"
            )
            if key.startswith("rollout.engine.") and leaf != "_target_":
                spec = engine_spec(cfg, "/weights", "fp32")
                assert spec.get(leaf) == OmegaConf.select(cfg, key), (
                    f"{key}={raw} was accepted but the engine is built with {leaf}={spec.get(leaf)!r}"
                )
            elif leaf not in read and leaf != "_target_" and not key.startswith(("reward.", "tags")):
                unused.append(key)
            arrived.append(key)
            break
        else:
            refused.append(key)
    assert not unused, f"keys accepted but read nowhere in train/: {unused}"
    assert "rollout.engine.model_path" in refused  # the trainer gives the weights: not a key to set
    print(f"{len(keys)} keys checked: {len(arrived)} arrive where used, {len(refused)} refused")
