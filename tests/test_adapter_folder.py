"""Damaged LoRA adapter folders given to an eval (`--ckpt`, issue 44): weights cut short, a base that is
itself an adapter, an adapter trained on another base, a missing weights file. Each is one
AdapterFolderError line naming the folder and what is wrong (before: 26-37-line tracebacks, or "Repo id
must be in the form ..."). Plus seeded fuzzing of adapter_config.json and of the weights file."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from infra.checkpoint.adapter import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterFolderError,
    adapter_base,
    check_weights,
    merged_model_from_adapter,
)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A good adapter of the tiny model and the issue's four damaged copies of it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from infra.models import build_tiny_model

    root = tmp_path_factory.mktemp("adapters")
    base = build_tiny_model(root / "base")

    def adapter(model_dir, out):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(out)
        return out

    good = adapter(base, root / "good")
    folders = {"good": good}
    folders["truncated"] = shutil.copytree(good, root / "truncated")
    weights = folders["truncated"] / ADAPTER_WEIGHTS
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    folders["base_is_adapter"] = shutil.copytree(good, root / "base_is_adapter")
    _edit_config(folders["base_is_adapter"], base_model_name_or_path=str(good))
    folders["other_base"] = adapter(build_tiny_model(root / "wider", hidden_size=192), root / "other_base")
    _edit_config(folders["other_base"], base_model_name_or_path=str(base))
    folders["no_weights"] = shutil.copytree(good, root / "no_weights")
    (folders["no_weights"] / ADAPTER_WEIGHTS).unlink()
    return folders


def _edit_config(folder, **changes) -> None:
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config | changes))


DAMAGE = {
    "truncated": "adapter_model.safetensors is cut short (",
    "base_is_adapter": "is itself a LoRA adapter folder, not a model",
    "other_base": "trained on another base model than",
    "no_weights": "no adapter_model.safetensors beside adapter_config.json",
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_each_damaged_adapter_folder_is_one_line_naming_it(adapters, case):
    with pytest.raises(AdapterFolderError) as caught:
        merged_model_from_adapter(adapters[case])
    line = str(caught.value)
    assert line.startswith(f"{adapters[case]}: ") and DAMAGE[case] in line and "\n" not in line, line


def test_an_adapter_trained_on_another_base_names_the_weight_and_both_shapes(adapters):
    with pytest.raises(
        AdapterFolderError, match=r"lora_A.default.weight is \[4, 192\] in the adapter, \[4, 128\]"
    ):
        merged_model_from_adapter(adapters["other_base"])


def test_a_whole_adapter_folder_still_merges(adapters):
    assert merged_model_from_adapter(adapters["good"]).config.hidden_size == 128


# ---- fuzzing ------------------------------------------------------------------------------------

WRONG = ["", None, 4, -1, 10**400, 1e308 * 10, float("nan"), True, [1], {"a": 1}, "x" * 100_000, "\x00",
         "/no/such/base", [[[[]]]]]  # fmt: skip


def damaged_config(rng: random.Random, config: dict) -> str:
    text = json.dumps(config)
    how = rng.randrange(5)
    if how == 0:
        return text[: rng.randrange(len(text))]
    if how == 1:
        return json.dumps(config | {rng.choice(list(config)): rng.choice(WRONG)})
    if how == 2:
        depth = rng.choice([50, 5000, 100_000])
        return text[:-1] + ', "r": ' + "[" * depth + "]" * depth + "}"
    if how == 3:
        return json.dumps(rng.choice([[], "x", 5, None]))
    return rng.choice(["", "\xff\xfe", "{", "NaN", text + text])


def _outcome(read, folder) -> str:
    """ "read" when `read(folder)` returns, "one line" when it raises AdapterFolderError naming the folder."""
    try:
        read(folder)
        return "read"
    except AdapterFolderError as exc:
        assert str(exc).startswith(f"{folder}: ") and "\n" not in str(exc), str(exc)
        return "one line"


def test_fuzzed_adapter_configs_are_a_merge_or_one_line(adapters, tmp_path):
    """300 damaged adapter_config.json files: reading the base is the folder's base or one line; every
    tenth input goes through the whole merge when its base reads (PEFT reads every field): a model or one
    line."""
    rng = random.Random(44)
    config = json.loads((adapters["good"] / ADAPTER_CONFIG).read_text())
    folder = shutil.copytree(adapters["good"], tmp_path / "fuzzed")
    outcomes = {"base read": 0, "base one line": 0, "merge read": 0, "merge one line": 0}
    for i in range(300):
        (folder / ADAPTER_CONFIG).write_text(damaged_config(rng, config), errors="surrogateescape")
        base = _outcome(adapter_base, folder)
        outcomes[f"base {base}"] += 1
        if base == "read" and i % 10 == 0:
            outcomes[f"merge {_outcome(merged_model_from_adapter, folder)}"] += 1
    print(f"\n[measure] 300 fuzzed adapter configs: {outcomes}")
    assert outcomes["base one line"] and outcomes["base read"]


def test_fuzzed_adapter_weights_are_whole_or_one_line(adapters, tmp_path):
    """300 weights files cut at random lengths, or with random bytes changed in their header."""
    rng = random.Random(45)
    whole = (adapters["good"] / ADAPTER_WEIGHTS).read_bytes()
    header_end = 8 + int.from_bytes(whole[:8], "little")
    folder = shutil.copytree(adapters["good"], tmp_path / "fuzzed")
    refused = 0
    for _ in range(300):
        data = bytearray(whole[: rng.randrange(len(whole))] if rng.random() < 0.5 else whole)
        if len(data) == len(whole):
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(header_end)] = rng.randrange(256)
        (folder / ADAPTER_WEIGHTS).write_bytes(bytes(data))
        try:
            check_weights(folder)
        except AdapterFolderError as exc:
            assert str(exc).startswith(f"{folder}: {ADAPTER_WEIGHTS} ") and "\n" not in str(exc), str(exc)
            refused += 1
    print(f"\n[measure] 300 fuzzed adapter weights files: {refused} refused in one line")
    assert refused >= 150  # every cut file at least
