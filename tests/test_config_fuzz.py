"""Seeded fuzzing of what a user types or writes that the config parser reads (issue 52): `key=value`
overrides (grammar breakers, interpolations to missing keys and to themselves, resolvers with bad arguments,
unknown resolvers, wrong types, `+`/`++`/`~` prefixes, unicode, empty and deep keys) and the values inside
an experiment file (any key of its config:, presets:, sweep: and stages: sections given a wrong type, an
interpolation that does not resolve, a list for a map, a section gone). Each goes through the functions the
CLIs call (`build_config`: python -m train; `plan` and `parse_grid_overrides`: make sweep; the pipeline's
`plan`) and either builds or is one ConfigError line; never another exception. Damage to the YAML itself
is tests/test_config_files_fuzz.py's."""

from __future__ import annotations

import copy
import random
import subprocess
import sys

import pytest
import yaml

from infra.models import PROJECT_ROOT
from train.config import ConfigError, build_config, train_schema

VALUES = [
    "]", "[", "{", "}", "=", "==", "'", '"', ":", "- a", "&a", "*a", "!!python/object:os.system x", "|", ">",
    "%", "@", "`", "{a: [}", "[1,", "\t", "\\", "$", "${", "${}", "${.}", "${..}", "${.}=${.}", "${a:}",
    "${oc.decode:'[1'}", "${oc.decode:1}", "${oc.decode:'{a: 1}'}", "${oc.decode:'[1,2]'}",
    "${oc.env:RLPOST_FUZZ_UNSET}", "${oc.env:}", "${oc.env:A,B,C}", "${oc.env:HOME}", "${oc.create:'[1'}",
    "${oc.select:}", "${oc.select:nope.nope}", "${oc.dict.keys:nope}", "${oc.dict.values:optim}",
    "${oc.deprecated:seed}", "${nope:1}", "${nope.nope}", "${seed.x}", "${optim}", "${optim.lr}", "${..nope}",
    "${oc.decode:${nope}}", "\\${x}", "???", "é", "\u202e", "\x00", "💥", "1e999", "-inf", "nan", "9" * 400,
    "9" * 5000, "[" * 3000, "a\nb", "-1", "0", "[1,2]", "{a: 1}", "[[[]]]", "{_target_: nope.Nope}", "null", "true", "", "  ", "a=b",
]  # fmt: skip
KEY_FORMS = ["{k}", "+{k}", "++{k}", "~{k}", "{k}.x", "{k}.x.y", "{k}.", ".{k}", "{k}..x", "{k}[0]",
             "{k}.0", "{k}.é", "{k}.${{x}}", "{k} ", " {k}"]  # fmt: skip
ODD_KEYS = ["", ".", "..", "+", "++", "~", "$", "${x}", "0", "-1", "é", "tags.é", "tags.a b", "\u202e",
            ".".join(["a"] * 60), ".".join(["optim"] * 30), "reward.judge.judge.judge.x"]  # fmt: skip


def config_keys() -> list[str]:
    """Every dotted key of the GRPO schema, sections included."""
    found: list[str] = []

    def walk(node, prefix: str) -> None:
        for k, v in node.items():
            found.append(prefix + k)
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")

    from omegaconf import OmegaConf

    walk(OmegaConf.to_container(OmegaConf.structured(train_schema())), "")
    return found


def mutated_overrides(rng: random.Random, keys: list[str]) -> list[str]:
    """One or two overrides, one of them mutated (or a pair that refer to each other)."""
    key = rng.choice(keys)
    how = rng.randrange(8)
    if how == 0:  # a key of another shape
        key = rng.choice(KEY_FORMS).format(k=key)
    elif how == 1:
        key = rng.choice(ODD_KEYS)
    if how == 2:
        value = f"${{{key}}}"  # itself
    elif how == 3:
        other = rng.choice(keys)
        return [f"{key}=${{{other}}}", f"{other}=${{{key}}}"]  # a cycle, or a type error
    elif how == 4:  # random bytes of the grammar
        value = "".join(rng.choice("[]{}$:=,'\"\\ .~+é\t0a") for _ in range(rng.randrange(1, 12)))
    else:
        value = rng.choice(VALUES)
    form = rng.randrange(10)
    item = {0: key, 1: f"={value}", 2: f"{key}=={value}", 3: f"{key}={value}={value}"}.get(
        form, f"{key}={value}"
    )
    return rng.sample(["seed=3", item], 2) if rng.random() < 0.3 else [item]


def one_line(exc: ConfigError) -> str:
    """The error's text, asserted to be one non-empty line."""
    text = str(exc)
    assert text.strip() and "\n" not in text and "Traceback" not in text, repr(text)
    return text


@pytest.mark.filterwarnings("ignore:.*is deprecated:UserWarning")  # ${oc.deprecated:...} says so
def test_fuzzed_overrides_build_or_are_one_line(monkeypatch):
    """700 mutated command lines through `build_config` (what python -m train runs)."""
    monkeypatch.delenv("RLPOST_FUZZ_UNSET", raising=False)
    keys = config_keys()
    rng = random.Random(52)
    outcomes = {"built": 0, "one line": 0}
    for _ in range(700):
        overrides = mutated_overrides(rng, keys)
        try:
            build_config(overrides=overrides)
            outcomes["built"] += 1
        except ConfigError as exc:
            one_line(exc)
            outcomes["one line"] += 1
    print(f"\n[measure] 700 fuzzed override lists through build_config: {outcomes}")
    assert outcomes["built"] >= 10 and outcomes["one line"] >= 500


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "optim.lr=${nope.nope}",
            r"for optim.lr: Interpolation key 'nope.nope' not found; point the \$\{...\} at",
        ),
        (
            "++rollout.max_new_tokens=8",
            r"\+, \+\+ and ~ prefixes are not taken here .*set it as rollout.max_new_tokens=8",
        ),
        ("~optim.lr", r"prefixes are not taken here .*set it as optim.lr=null"),
        ("optim.lr=${.}=${.}", r"for optim.lr: .*; close every \$\{ with \}"),
        ("algorithm.x.y==", r"'algorithm.x.y==': the value '=' is not valid YAML .*; quote it"),
        ("rollout.max_new_tokens=]", r"the value '\]' is not valid YAML"),
        ("optim.lr=${optim.lr}", "for optim.lr: Recursive interpolation detected; it refers to itself"),
        ("optim.lr=${nope:1}", "for optim.lr: Unsupported interpolation type nope; the resolvers are oc.env"),
        (
            "optim.lr=${oc.env:RLPOST_FUZZ_UNSET}",
            r"for optim.lr: .*not found.*; fix .*\$\{oc.env:NAME,default\}",
        ),
        ("optim.lr=${oc.decode:'[1,2]'}", "for optim.lr: .*could not be converted to Float; the"),
        ("optim.lr=???", r"'optim.lr=\?\?\?': \?\?\? means no value; give optim.lr a value"),
        ("policy.lora=[1]", "for policy.lora: .*; give it the type and shape of its default"),
        ("env.tools=5", "env.tools=5: expected a list"),
        ("a..b=1", "the key 'a..b' has an empty part"),
        ("optim.lr=" + "[" * 40 + "]" * 40, "nested deeper than 32 levels"),
    ],
)
def test_each_kind_of_bad_override_names_the_key_and_the_fix(override, expected, monkeypatch):
    """The probe's tracebacks (issue 52) and their kin: one line each, the key named, the fix given."""
    monkeypatch.delenv("RLPOST_FUZZ_UNSET", raising=False)
    with pytest.raises(ConfigError, match=expected) as caught:
        build_config(overrides=[override])
    one_line(caught.value)


def test_a_file_value_that_does_not_resolve_names_its_key(tmp_path, monkeypatch):
    monkeypatch.setattr("train.config.EXPERIMENTS_DIR", tmp_path)
    (tmp_path / "bad.yaml").write_text("config:\n  optim:\n    lr: ${oc.decode:'[1'}\n")
    with pytest.raises(ConfigError, match=r"for optim.lr: GrammarParseError .*; fix the resolver's argument"):
        build_config("bad")


# ---- experiment files -------------------------------------------------------------------------

SINGLE = {
    "description": "one point",
    "config": {"total_steps": 2, "seed": 1, "optim": {"lr": 1.0e-6, "schedule": "cosine"},
               "rollout": {"n": 4, "engine": {"_target_": "train.rollout.hf_engine.HFEngine"}},
               "reward": {"_target_": "train.rewards.math_reward.MathReward", "timeout_s": 2.0},
               "env": {"tools": []}, "tags": {"who": "fuzz"}, "policy": {"lora": {"rank": 0}}},
    "presets": {"fast": {"rollout": {"max_new_tokens": 8}, "optim": {"lr": "${optim.weight_decay}"}}},
    "sweep": {"grid": {"seed": [1]}, "max_parallel": 1},
}  # fmt: skip
STAGED = {
    "stages": {
        "sft": {"_target_": "train.stages.sft.SFTStage",
                "config": {"total_steps": 1, "data": {"batch_size": 2}, "optim": {"lr": 1.0e-3}}},
        "grpo": {"_target_": "train.stages.grpo.GRPOStage", "model_from": "sft",
                 "config": {"total_steps": 1, "data": {"prompts_per_step": 2}, "rollout": {"n": 2}}},
    },
    "sweep": {"grid": {"grpo.seed": [1]}},
}  # fmt: skip
FILE_VALUES = [
    "${nope.nope}", "${oc.decode:'[1'}", "${oc.env:RLPOST_FUZZ_UNSET}", "${nope:1}", "${.}", "${..}",
    "${optim}", "${seed}", "${oc.create:'{a: 1'}", "${}", "???", 1e999, -1, 0, 2**80, "é", "",
    None, True, [1, 2], [], [[]], {"a": 1}, {}, {"_target_": "nope.Nope"}, "train.stages.nope.Stage", "sft",
]  # fmt: skip


def paths_of(node, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a nested dict (lists are leaves)."""
    out = []
    for k, v in node.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += paths_of(v, (*prefix, k))
    return out


def mutated_file(rng: random.Random, base: dict) -> dict:
    """A copy of `base` with one key given a wrong value, removed, turned into a list, or a key added."""
    doc = copy.deepcopy(base)
    path = rng.choice(paths_of(doc))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    how = rng.randrange(6)
    if how == 0:
        del parent[path[-1]]
    elif how == 1:  # a list where a map (or a value) was
        parent[path[-1]] = [parent[path[-1]]]
    elif how == 2:  # an unknown key beside it
        parent[rng.choice(["nope", "_target_", "config", "model_from", "base", "é", "", "x.y"])] = rng.choice(
            FILE_VALUES
        )
    elif how == 3:  # an interpolation to itself
        parent[path[-1]] = "${" + ".".join(map(str, path)) + "}"
    else:
        parent[path[-1]] = rng.choice(FILE_VALUES)
    return doc


def staged_sweep(item: str, as_grid: bool) -> None:
    """make sweep of the staged experiment with `item` as an override, or as a --grid of two values."""
    from orchestration import sweep

    if as_grid:
        sweep.plan("fuzz", [], sweep.parse_grid_overrides([item.replace("=", "=1,", 1)]))
    else:
        sweep.plan("fuzz", [item])


@pytest.fixture
def experiments(tmp_path, monkeypatch):
    monkeypatch.setattr("train.config.EXPERIMENTS_DIR", tmp_path)
    monkeypatch.delenv("RLPOST_FUZZ_UNSET", raising=False)
    return tmp_path


@pytest.mark.filterwarnings("ignore:.*is deprecated:UserWarning")
def test_fuzzed_experiment_values_plan_or_are_one_line(experiments):
    """250 experiment files with one key damaged, each through make sweep's `plan` (a one-point grid) or what
    python -m train (`build_config`, with or without a preset) or the pipeline (`plan`) runs; then 50 command
    lines of a staged sweep (`grpo.<key>=<value>`, as an override or a --grid)."""
    from orchestration import pipeline, sweep

    rng = random.Random(520)
    outcomes = {"planned": 0, "one line": 0}

    def attempt(call, *args) -> None:
        try:
            call(*args)
            outcomes["planned"] += 1
        except ConfigError as exc:
            one_line(exc)
            outcomes["one line"] += 1

    for i in range(250):
        staged = i % 5 == 0
        doc = mutated_file(rng, STAGED if staged else SINGLE)
        (experiments / "fuzz.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        if i % 2:
            attempt(sweep.plan, "fuzz", [])
        elif staged:
            attempt(pipeline.plan, "fuzz", ["grpo.seed=2"])
        else:
            attempt(build_config, "fuzz", [], rng.choice([None, "fast", "nope"]))
    keys = config_keys()
    (experiments / "fuzz.yaml").write_text(yaml.safe_dump(STAGED, sort_keys=False))
    for _ in range(50):
        item = f"grpo.{mutated_overrides(rng, keys)[-1]}"
        attempt(staged_sweep, item, rng.random() < 0.5)
    print(f"\n[measure] 300 fuzzed experiment values and staged command lines: {outcomes}")
    assert outcomes["planned"] >= 10 and outcomes["one line"] >= 100


# ---- the CLIs themselves: one line, no traceback (two processes: slow) --------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-m", "train", "optim.lr=${nope.nope}", "--validate"],
        [sys.executable, "-m", "orchestration.sweep", "grpo_math", "++rollout.max_new_tokens=]"],
    ],
    ids=["train", "sweep"],
)
def test_cli_prints_one_line_without_a_traceback(argv):
    done = subprocess.run(argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and "Traceback" not in output, output
    assert len(output.splitlines()) == 1 and output.startswith("error: "), output
