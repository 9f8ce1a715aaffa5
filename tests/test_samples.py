"""Logged samples (train/samples.py): the records on hand-made rollouts, their MLflow artifacts in a real
store, and a real GRPO step and validation of the darling_math experiment (tiny model) logging them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from infra.tracking import Tracker, mlflow_client
from train.config import build_config
from train.samples import due, log_rollout, response_means, sample_records, table_rows, write_samples

ROWS = [
    {"prompt": [{"role": "user", "content": "Q0"}], "ground_truth": "4", "data_source": "d"},
    {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "Q1"}], "ground_truth": ""},
]


def _records(max_groups=None):
    group_index = [0, 0, 0, 1, 1, 1]
    texts = ["so 4", "\\boxed{5}", "four", "a", "b", "a"]
    signals = {
        "partition_class": [0, 1, 2, 0, 1, 0],
        "quality": [1.0, 0.0, 0.0, 0.5, 0.2, 0.5],
        "cot_spans": [(0, 1)] * 6,  # not a scalar per response: left out
    }
    return sample_records(
        "train", 10, [ROWS[g] for g in group_index], texts, group_index,
        scores=[0.9, 0.1, 0.0, 0.4, 0.2, 0.4], correct=[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], signals=signals,
        advantages=[0.5, -0.2, -0.3, 0.1, -0.2, 0.1], lengths=[2, 3, 1, 1, 1, 1],
        finish_reasons=["stop"] * 5 + ["length"], max_groups=max_groups,
    )  # fmt: skip


def test_records_hold_each_groups_prompt_answers_reward_parts_and_advantages():
    records = _records()
    assert [r["group"] for r in records] == [0, 1] and all(r["step"] == 10 for r in records)
    first, second = records
    assert first["prompt"] == "Q0" and first["gold"] == "4" and first["data_source"] == "d"
    assert second["prompt"] == "Q1" and second["gold"] is None  # the last user turn; no gold
    assert first["responses"][0] == {
        "text": "so 4", "answer": "4", "reward": 0.9, "correct": 1.0, "class": 0, "quality": 1.0,
        "advantage": 0.5, "length": 2, "finish": "stop",
    }  # fmt: skip
    assert [r["answer"] for r in first["responses"]] == ["4", "5", "four"]  # the grader's extraction
    assert [r["class"] for r in second["responses"]] == [0, 1, 0]
    assert all(r["answer"] is None for r in second["responses"])  # no gold: nothing is graded
    assert "cot_spans" not in second["responses"][0] and second["responses"][2]["finish"] == "length"


def test_records_keep_the_first_groups_only_when_asked():
    assert [r["prompt"] for r in _records(max_groups=1)] == ["Q0"]


def test_samples_are_due_at_the_start_and_every_n_steps():
    assert [s for s in range(1, 31) if due(s, 10)] == [1, 10, 20, 30]
    assert not any(due(s, 0) for s in range(1, 31))


def test_advantage_per_response_is_the_mean_over_its_tokens():
    adv = torch.tensor([[1.0, 3.0, 9.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert response_means(adv, mask) == [2.0, -2.0]


def test_table_has_one_row_per_response_and_cuts_long_text():
    records = _records()
    records[0]["responses"][0]["text"] = "x" * 5000
    records[0]["gold"] = ",".join(map(str, range(100)))
    table = table_rows(records)
    assert len(table["text"]) == 6 and len(table["text"][0]) == 2000 and len(table["gold"][0]) == 200
    assert table["prompt"] == ["Q0"] * 3 + ["Q1"] * 3 and table["class"] == [0, 1, 2, 0, 1, 0]


def test_written_samples_are_jsonl_and_a_table_on_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    tracker = Tracker()
    run_id = tracker.start("samples", "r")
    write_samples(tracker, "train", 10, _records())
    client = mlflow_client()
    paths = sorted(a.path for a in client.list_artifacts(run_id, "samples/train"))
    assert paths == ["samples/train/000010.jsonl", "samples/train/000010.table.json"]
    local = Path(client.download_artifacts(run_id, "samples/train/000010.jsonl", str(tmp_path)))
    assert [json.loads(x) for x in local.read_text().splitlines()] == _records()
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "samples/train/000010.table.json", "type": "table"} in logged  # the UI's tables


def test_a_failed_write_is_a_warning_not_a_failed_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker()
    tracker.start("samples", "r")
    tracker.run_id = "0" * 32  # a run the store does not have
    write_samples(tracker, "val", 0, _records())
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("20")]  # less MLflow's INFO
    assert err == [
        "warning: val samples of step 0 not logged to MLflow: Run with id=" + "0" * 32 + " not found"
    ]


def test_nothing_is_built_off_rank_zero_or_between_due_steps():
    class Boom:
        def __getattr__(self, name):
            raise AssertionError("the rollout was read")

    log_rollout(Tracker(enabled=False), "val", 0, [], Boom(), Boom())
    log_rollout(SimpleNamespace(enabled=True, run_id="x"), "train", 5, [], Boom(), Boom(), every=10)


@pytest.mark.slow
def test_a_darling_step_and_validation_log_their_samples(tiny_model, vllm_engine, tmp_path, monkeypatch):
    """The darling_math experiment (tiny model): step 1 logs its groups with DARLING's classes, reward
    parts and advantages; the validation at step 0 logs every held-out group."""
    from train.stages.grpo import GRPOTrainer

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    cfg = build_config(
        "darling_math",
        [
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "total_steps=1", "val_every=1",
            "data.prompts_per_step=2", "data.builtin_size=8", "data.val_size=3", "data.val_n=3", "rollout.n=3",
            "rollout.max_new_tokens=6",
        ],
    )  # fmt: skip
    cfg.run_name = "samples"
    trainer = GRPOTrainer(cfg, engine=vllm_engine)
    try:
        trainer.validate(0)
        trainer.step(1)
    finally:
        trainer.tracker.finish()
    client = mlflow_client()
    folder = Path(client.download_artifacts(trainer.run_id, "samples", str(tmp_path / "dl")))
    train = [json.loads(x) for x in (folder / "train" / "000001.jsonl").read_text().splitlines()]
    val = [json.loads(x) for x in (folder / "val" / "000000.jsonl").read_text().splitlines()]
    assert len(train) == 2 and len(val) == 3
    for record in train + val:
        assert record["prompt"].startswith("Give") and record["gold"]
        assert len(record["responses"]) == 3
        for r in record["responses"]:
            assert {"text", "answer", "reward", "correct", "class", "quality", "diversity"} <= set(r)
            assert r["reward"] == pytest.approx(r["quality"] * r["diversity"])  # DARLING's product
    advantages = [r["advantage"] for rec in train for r in rec["responses"]]
    for rec in train:  # GRPO without std: r - group mean, the same on every token
        mean = sum(r["reward"] for r in rec["responses"]) / 3
        assert [r["advantage"] for r in rec["responses"]] == pytest.approx(
            [r["reward"] - mean for r in rec["responses"]]
        )
    assert len(advantages) == 6


def test_multi_turn_records_keep_each_turn_and_who_wrote_it():
    from train.samples import sample_records

    episodes = [
        {"segments": [{"role": "model", "text": "call"}, {"role": "env", "text": "42"}, {"role": "model", "text": "42"}],
         "tool_calls": 1, "stop": "answered"},
        {"segments": [{"role": "model", "text": "7"}], "tool_calls": 0, "stop": "answered"},
    ]  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": "q"}], "ground_truth": "42"}] * 2
    (record,) = sample_records("train", 1, rows, ["42", "7"], [0, 0], [1.0, 0.0], episodes=episodes)
    first, second = record["responses"]
    assert first["turns"] == [
        {"role": "model", "text": "call"},
        {"role": "env", "text": "42"},
        {"role": "model", "text": "42"},
    ]
    assert first["tool_calls"] == 1 and second["turns"] == [{"role": "model", "text": "7"}]
    (plain,) = sample_records("train", 1, rows, ["42", "7"], [0, 0], [1.0, 0.0])
    assert "turns" not in plain["responses"][0]


def test_eval_samples_with_tools_show_every_turn_labelled():
    from analysis.sample_index import samples_of

    record = {"id": "t/0", "dataset": "tool_math", "gold": "6", "responses": ["6"], "answers": ["6"], "correct": [1.0],
              "tool_calls": [1], "turns": [2],
              "trajectories": [[{"role": "model", "text": "<tool_call>x</tool_call>"}, {"role": "env", "text": "6"},
                                {"role": "model", "text": "6"}]]}  # fmt: skip
    (s,) = samples_of("math", record)
    assert s["response"] == "[model]\n<tool_call>x</tool_call>\n\n[tool]\n6\n\n[model]\n6"
    assert s["extra"]["tool_calls"] == [1] and s["correct"] == 1
