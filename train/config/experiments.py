"""Reading an experiment file (`experiments/<name>.yaml`): found by name, its shape checked before
OmegaConf builds it, every fault one line naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from infra.models import PROJECT_ROOT
from train.config.errors import ConfigError

EXPERIMENTS_DIR = Path(os.environ.get("RLPOST_EXPERIMENTS_DIR", PROJECT_ROOT / "experiments"))


def experiments_dir() -> Path:
    """`train.config.EXPERIMENTS_DIR`, read at call time: tests and bench point the package's name elsewhere."""
    import train.config

    return train.config.EXPERIMENTS_DIR


def experiment_file(name: str) -> Path:
    folder = experiments_dir()
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(f"unknown experiment {name!r}: no {path} (known: {', '.join(known) or 'none'})")
    return path


EXPERIMENT_SECTIONS = ("config", "presets", "sweep", "stages")  # each a mapping when present
MAX_YAML_DEPTH, MAX_YAML_NODES = 32, 100_000  # far above any experiment; OmegaConf recurses, slowly
FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's


def check_shape(value, where: Path | str) -> None:
    """ConfigError (starting with `where`: a file, an override) for YAML nested deeper than MAX_YAML_DEPTH or
    (aliases repeated) larger than MAX_YAML_NODES, checked on libyaml's fast parse before OmegaConf builds it
    (seconds, then RecursionError)."""
    todo, seen = [(value, 1)], 0
    while todo:
        v, depth = todo.pop()
        seen += 1
        if depth > MAX_YAML_DEPTH or seen > MAX_YAML_NODES:
            deep = f"nested deeper than {MAX_YAML_DEPTH} levels"
            raise ConfigError(
                f"{where}: {deep if depth > MAX_YAML_DEPTH else 'too large (aliases repeated?)'}"
            )
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        todo += [(x, depth + 1) for x in items]


def load_experiment(name: str) -> DictConfig:
    """An experiment file (a mapping of config, presets, sweep, stages), or ConfigError naming the file
    and where or what is wrong in it."""
    path = experiment_file(name)
    try:
        check_shape(yaml.load(path.read_bytes(), Loader=FAST_LOADER), path)
        exp = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = (getattr(exc, "problem", None) or str(exc).splitlines()[0]).strip()
        raise ConfigError(f"{path}: not valid YAML{where} ({what})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deep to read") from None
    except Exception as exc:  # noqa: BLE001 - bytes that are not UTF-8, values OmegaConf refuses
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise ConfigError(f"{path}: cannot be read ({first.strip()[:160]})") from None
    if not isinstance(exp, DictConfig):
        raise ConfigError(f"{path}: holds a list, not a mapping of {', '.join(EXPERIMENT_SECTIONS)}")
    raw = OmegaConf.to_container(exp, resolve=False)
    for section in EXPERIMENT_SECTIONS:
        if raw.get(section) is not None and not isinstance(raw[section], dict):
            raise ConfigError(f"{path}: `{section}:` is {str(raw[section])[:40]!r}, not a mapping of keys")
    return exp
