"""Seeded fuzzing of the files a user or a crash can damage that a sweep reads (issue 44): an experiment
YAML (its `config:`, `sweep:` and `stages:` sections) and a checkpoint's meta.json. Every damaged file
is one ConfigError line, a checkpoint named damaged, or read as it is; never a traceback or a hang."""

from __future__ import annotations

import json
import random

import pytest

from infra.checkpoint import layout as layout
from train.config import ConfigError, load_experiment

EXPERIMENT = """\
# a sweep of one point per seed
config:
  total_steps: 2
  seed: 1
  optim:
    lr: 1.0e-6
  rollout:
    n: 4
sweep:
  grid:
    seed: [1, 2]
  max_parallel: 1
"""
WRONG_YAML = ["[1, 2]", "{a: {b: {c: 1}}}", "'x'", "null", "1e999", "9" * 5000, "-1", "true", "[[[[[]]]]]",
              "{", "}", ":", "- a", "!!python/object:os.system x", "&a [*a]", "*undefined", "\t", "\"\\x\""]  # fmt: skip


def damaged_yaml(rng: random.Random) -> str:
    lines = EXPERIMENT.splitlines()
    how = rng.randrange(5)
    if how == 0:
        return EXPERIMENT[: rng.randrange(len(EXPERIMENT))]
    if how == 1:  # a value of the wrong type
        i = rng.choice([i for i, ln in enumerate(lines) if ":" in ln])
        key = lines[i].split(":")[0]
        lines[i] = f"{key}: {rng.choice(WRONG_YAML)}"
        return "\n".join(lines) + "\n"
    if how == 2:  # deep nesting
        depth = rng.choice([50, 2000, 20_000])
        return EXPERIMENT + f"extra: {'[' * depth}{']' * depth}\n"
    if how == 3:  # a section replaced
        section = rng.choice(["config", "sweep", "grid", "stages"])
        return EXPERIMENT + f"{section}: {rng.choice(WRONG_YAML)}\n"
    return rng.choice(["", "\x00\xff", "---\n---\n", "- config\n", EXPERIMENT.replace("  ", "\t", 1)])


@pytest.fixture
def experiments(tmp_path, monkeypatch):
    monkeypatch.setattr("train.config.EXPERIMENTS_DIR", tmp_path)
    return tmp_path


def test_fuzzed_experiment_yaml_is_read_or_one_line(experiments):
    """300 damaged experiment files through what a sweep reads before building any config: the file,
    its sweep section and grid (`sweep_grid`)."""
    from orchestration.sweep import sweep_grid

    rng = random.Random(44)
    outcomes = {"read": 0, "one line": 0}
    for _ in range(300):
        (experiments / "fuzz.yaml").write_text(damaged_yaml(rng), errors="surrogateescape")
        try:
            exp = load_experiment("fuzz")
            sweep_grid(exp, "fuzz")
            outcomes["read"] += 1
        except ConfigError as exc:
            assert "\n" not in str(exc) and str(exc), repr(str(exc))
            outcomes["one line"] += 1
    print(f"\n[measure] 300 fuzzed experiment files: {outcomes}")
    assert outcomes["read"] and outcomes["one line"]


@pytest.mark.slow
def test_fuzzed_experiment_yaml_through_the_whole_plan(experiments):
    """20 of them through `plan` (every point's config built and validated: ~1 s each)."""
    from orchestration.sweep import plan

    rng = random.Random(45)
    outcomes = {"planned": 0, "one line": 0}
    for _ in range(20):
        (experiments / "fuzz.yaml").write_text(damaged_yaml(rng), errors="surrogateescape")
        try:
            plan("fuzz", [])
            outcomes["planned"] += 1
        except ConfigError as exc:
            assert "\n" not in str(exc).strip(), repr(str(exc))
            outcomes["one line"] += 1
    print(f"\n[measure] 20 fuzzed experiment files through plan: {outcomes}")


# ---- checkpoint meta.json -----------------------------------------------------------------------


def damaged_meta(rng: random.Random, meta: dict) -> str:
    text = json.dumps(meta)
    how = rng.randrange(5)
    if how == 0:
        return text[: rng.randrange(len(text))]
    wrong = rng.choice(["two", [0], {"x": 1}, None, True, -1, 10**400, 1e308 * 10, float("nan"), "", [[[]]]])
    if how == 1:
        return json.dumps(meta | {rng.choice(list(meta)): wrong})
    if how == 2:  # a manifest or checksum entry of the wrong type
        part = rng.choice([layout.MANIFEST, layout.CHECKSUMS])
        inner = dict(meta[part])
        inner[rng.choice([*inner, "hf/x", "../../etc/passwd", "/abs", ""])] = wrong
        return json.dumps(meta | {part: inner})
    if how == 3:
        depth = rng.choice([50, 5000, 100_000])
        return text[:-1] + ', "step": ' + "[" * depth + "]" * depth + "}"
    return rng.choice(["", "null", "[]", "\x00\xff", "NaN", text + text, "{}"])


def test_fuzzed_checkpoint_meta_is_damaged_in_one_line_or_whole(make_checkpoint, tmp_path):
    """300 damaged meta.json files of a real checkpoint: `damage` names the problem in one line (or finds
    none), and the readers of a complete step (step_of, its time, latest_checkpoint, list_checkpoints)
    never raise."""
    rng = random.Random(46)
    step = make_checkpoint(tmp_path / "run", 3)
    meta = layout.read_meta(step)
    outcomes = {"whole": 0, "damaged": 0}
    for _ in range(300):
        (step / layout.META).write_text(damaged_meta(rng, meta), errors="surrogateescape")
        why = layout.damage(step)
        if why is None:
            assert layout.step_of(step) == 3
            float(layout.read_meta(step).get("time", 0.0))  # `--ckpt latest` orders checkpoints by it
            assert layout.latest_checkpoint(tmp_path / "run") == step
            outcomes["whole"] += 1
        else:
            assert isinstance(why, str) and "\n" not in why, repr(why)
            assert layout.latest_checkpoint(tmp_path / "run", warn=lambda _: None) is None
            assert layout.list_checkpoints(tmp_path / "run") == []
            outcomes["damaged"] += 1
    print(f"\n[measure] 300 fuzzed meta.json files: {outcomes}")
    assert outcomes["damaged"] and outcomes["whole"]
