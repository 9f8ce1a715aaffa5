"""evals.math: pass@k / maj@k by hand, the five benchmark loaders on ../shared/data/math, metric
breakdowns, and the suite end to end on the tiny model through vLLM with MLflow logging."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from data_prep.schema import DatasetError
from evals.common.cli import build_parser, main
from evals.common.generation import VLLMGenerator
from evals.common.metrics import majority_index
from evals.math import SUITE, _ks, item_metrics
from math_grader.pass_at_k import pass_at_k

SIZES = {"gsm8k": 1319, "math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272}


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(5, 1, 3) == pytest.approx(1 - 4 / 10)  # 1 - C(4,3)/C(5,3)
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 3, 3) == 1.0 and pass_at_k(1, 1, 1) == 1.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)


def test_majority_ties_go_to_the_answer_seen_first():
    assert majority_index(["3", "5", "5", "3"]) == 0
    assert majority_index(["5", "3", "3", "5", "3"]) == 1
    # upstream (Qwen's "" vote, lm-eval's "[invalid]"): no answer is a vote of its own
    assert majority_index([None, None, "7"]) == 0
    assert majority_index([None, None]) == 0
    # the option --maj-skip-unanswered: no answer, no vote
    assert majority_index([None, None, "7"], skip_unanswered=True) == 2
    assert majority_index([None, None], skip_unanswered=True) is None


def test_unanswered_samples_vote_as_upstream_counts_them():
    """The issue's example: [None, '42', None, '42', '3', '60'] with gold 42 is 0 upstream (the tie
    between "no answer" and "42" goes to "no answer", seen first), 1 with --maj-skip-unanswered."""
    answers = [None, "42", None, "42", "3", "60"]
    correct = [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert item_metrics(correct, answers, [6])["maj@6"] == 0.0
    assert item_metrics(correct, answers, [6], skip_unanswered=True)["maj@6"] == 1.0


def test_equivalence_votes_group_by_the_grader_first_member_first():
    from evals.common.metrics import group_by_equivalence

    same = lambda a, b: a.lstrip("0") == b.lstrip("0")  # noqa: E731  a toy equivalence
    assert group_by_equivalence(["1", "01", None, "2", None, "001"], same) == [0, 0, 1, 2, 1, 0]
    # real grader: 0.5 and \frac{1}{2} are one answer, but not the same normalised string
    answers = ["3", "0.5", "3", "\\frac{1}{2}", "1/2"]
    correct = [0.0, 1.0, 0.0, 1.0, 1.0]
    assert item_metrics(correct, answers, [5])["maj@5"] == 0.0  # strings: "3" x2 beats the others
    assert item_metrics(correct, answers, [5], vote="equivalence")["maj@5"] == 1.0  # 1/2 x3


def test_rm_at_k_takes_the_best_scored_sample_first_on_ties():
    correct = [0.0, 1.0, 0.0, 1.0]
    m = item_metrics(correct, ["1", "2", "1", "2"], [2, 4], rm_scores=[0.1, 0.9, 0.95, 0.2])
    assert m["rm@2"] == 1.0 and m["rm@4"] == 0.0
    assert item_metrics(correct, ["1", "2", "1", "2"], [4], rm_scores=[0.5] * 4)["rm@4"] == 0.0


def test_upstream_math_golds_vote_with_the_grader(shared_dir):
    """On math500's own gold answers: equivalence votes put a fraction gold and its decimal together."""
    from math_grader import is_equiv

    rows = [json.loads(x) for x in (shared_dir / "data/math/math500/test.jsonl").read_text().splitlines()]
    golds = [r["answer"] for r in rows]
    checked = 0
    for gold in golds:
        m = re.fullmatch(r"\\frac\{(\d+)\}\{([2458])\}", gold)
        if not m:
            continue
        decimal = str(int(m.group(1)) / int(m.group(2)))
        assert is_equiv(decimal, gold)
        answers, correct = ["7", "7", gold, decimal, decimal], [0.0, 0.0, 1.0, 1.0, 1.0]
        assert item_metrics(correct, answers, [5])["maj@5"] == 0.0  # strings: "7" x2 ties, seen first
        assert item_metrics(correct, answers, [5], vote="equivalence")["maj@5"] == 1.0
        checked += 1
    assert checked >= 2


def test_item_metrics_by_hand():
    m = item_metrics([0.0, 1.0, 1.0, 0.0], ["3", "5", "5", "3"], [1, 2, 4])
    assert m == pytest.approx(
        {"acc": 0.0, "pass@1": 0.5, "pass@2": 5 / 6, "pass@4": 1.0, "maj@1": 0.0, "maj@2": 0.0, "maj@4": 0.0}
    )
    # Answers are compared after the grader's normalisation: 1/2 and \frac{1}{2} are one vote.
    m = item_metrics([0.0, 1.0, 0.0, 1.0], ["3", "\\frac{1}{2}", "3", "1/2"], [4])
    assert m["maj@4"] == 0.0  # two votes each: the tie goes to "3", seen first
    m = item_metrics([0.0, 1.0, 1.0], ["3", "\\frac{1}{2}", "1/2"], [3])
    assert m["maj@3"] == 1.0 and m["pass@3"] == 1.0 and m["acc"] == 0.0
    m = item_metrics([1.0, 0.0, 0.0], ["4", None, None], [3])
    assert m["maj@3"] == 0.0  # two samples with no answer outvote "4" (upstream)
    assert _ks(8, None) == [1, 2, 4, 8] and _ks(6, None) == [1, 2, 4, 6] and _ks(4, [1, 3, 9]) == [1, 3]


def _args(argv: list[str]) -> argparse.Namespace:
    return build_parser(SUITE).parse_args(["--ckpt", "x", *argv])


def test_summarize_breakdowns_by_dataset_subject_and_level():
    recs = [
        {"id": "a", "dataset": "math500", "subject": "Algebra", "level": "1", "correct": [1.0, 0.0],
         "answers": ["2", "3"]},
        {"id": "b", "dataset": "math500", "subject": "Algebra", "level": "3", "correct": [0.0, 0.0],
         "answers": ["1", "1"]},
        {"id": "c", "dataset": "math500", "subject": "Geometry", "level": "3", "correct": [0.0, 1.0],
         "answers": ["7", "8"]},
        {"id": "d", "dataset": "gsm8k", "correct": [1.0, 1.0], "answers": ["18", "18"]},
    ]  # fmt: skip
    out = SUITE.summarize(recs, _args(["--n", "2"]))
    assert out["acc"] == 0.5 and out["n"] == 4.0
    assert out["pass@2"] == 0.75  # pass@2 per item: 1, 0, 1, 1
    assert out["maj@2"] == 0.5  # ties -> first sample: 1, 0, 0, 1
    assert out["math500/acc"] == pytest.approx(1 / 3) and out["gsm8k/acc"] == 1.0
    assert out["math500/subject/Algebra/acc"] == 0.5 and out["math500/subject/Geometry/acc"] == 0.0
    assert out["math500/level/3/acc"] == 0.0 and out["math500/level/3/n"] == 2.0
    assert out["math500/acc_ci_lo"] <= out["math500/acc"] <= out["math500/acc_ci_hi"]
    assert "gsm8k/subject" not in " ".join(out)


def test_loaders_read_all_five_benchmarks(shared_dir):
    items = SUITE.load_items(_args(["--data-dir", str(shared_dir / "data" / "math")]))
    counts = {d: sum(it["dataset"] == d for it in items) for d in SIZES}
    assert counts == SIZES
    assert len({it["id"] for it in items}) == len(items)
    first = next(it for it in items if it["dataset"] == "math500")
    assert first["prompt"][0]["role"] == "system" and "\\boxed{}" in first["prompt"][0]["content"]
    assert first["gold"] and first["subject"] and first["level"]
    assert all(it["gold"] for it in items)


def test_missing_data_and_unknown_dataset_are_one_line_errors(tmp_path):
    with pytest.raises(
        DatasetError, match=r"math data file not found: .*math500/test.jsonl \(set --data-dir"
    ):
        SUITE.load_items(_args(["--data-dir", str(tmp_path), "--datasets", "math500"]))
    with pytest.raises(DatasetError, match="unknown math dataset"):
        SUITE.load_items(_args(["--data-dir", str(tmp_path), "--datasets", "math5000"]))
    with pytest.raises(SystemExit, match="^error: math data file not found"):
        main(SUITE, ["--ckpt", str(tmp_path), "--data-dir", str(tmp_path), "--datasets", "gsm8k"])


class ScriptedGenerator:
    """Answers each problem: sample 0 with the gold answer boxed, sample 1 with a wrong one (grader check
    on real data, independent of a random model)."""

    def load(self, path):
        pass

    def generate(self, conversations, sampling):
        gold = {it["prompt"][1]["content"]: it["gold"] for it in self.items}
        out = []
        for conv in conversations:
            g = gold[conv[-1]["content"]]
            out.append(
                [f"So the answer is $\\boxed{{{g}}}$.", "The final answer is \\boxed{-12345}."][: sampling.n]
            )
        return out


def test_grading_real_golds_through_the_suite(shared_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = shared_dir / "data" / "math"
    plain = tmp_path / "model"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    gen = ScriptedGenerator()
    gen.items = SUITE.load_items(_args(["--data-dir", str(data)]))
    per_ds = []
    for ds in SIZES:
        argv = ["--ckpt", str(plain), "--data-dir", str(data), "--datasets", ds, "--limit", "5", "--n", "2",
                "--temperature", "1.0", "--results-dir", str(tmp_path / "res"), "--no-mlflow"]  # fmt: skip
        (s,) = main(SUITE, argv, generator=gen)
        per_ds.append(s["metrics"])
    for m in per_ds:
        assert m["acc"] == 1.0 and m["pass@2"] == 1.0 and m["pass@1"] == 0.5 and m["maj@2"] == 1.0


@pytest.mark.slow
def test_math_end_to_end_on_tiny_model(
    shared_dir, tiny_model, make_checkpoint, vllm_engine, tmp_path, monkeypatch
):
    import mlflow

    from infra.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    ck = make_checkpoint(tmp_path / "run", 3, seed=5)
    tracker = Tracker()
    run_id = tracker.start("exp", "run", tags={"rlpost.run_dir": str((tmp_path / "run").resolve())})
    tracker.record_checkpoint(3, ck.resolve())
    gen = VLLMGenerator(engine=vllm_engine)
    res = tmp_path / "res"
    argv = ["--ckpt", run_id, "--data-dir", str(shared_dir / "data" / "math"), "--datasets", "gsm8k",
            "--limit", "3", "--n", "2", "--temperature", "1.0", "--max-tokens", "8", "--results-dir", str(res)]  # fmt: skip
    try:
        (s,) = main(SUITE, argv, generator=gen)
    finally:
        gen.load(tiny_model)
    rows = [
        json.loads(x) for x in (res / "run-step_000003" / "math" / "samples.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 3 and all(len(r["responses"]) == 2 and len(r["correct"]) == 2 for r in rows)
    assert rows[0]["responses"][0] != rows[0]["responses"][1]  # T=1: two different samples
    assert {"gold", "answers", "dataset"} <= set(rows[0])
    m = s["metrics"]
    assert {"acc", "pass@1", "pass@2", "maj@1", "maj@2", "gsm8k/acc", "acc_ci_lo", "n"} <= set(m)
    hist = mlflow.MlflowClient().get_metric_history(run_id, "eval/math/gsm8k/pass_at_2")
    assert [(h.step, h.value) for h in hist] == [(3, m["gsm8k/pass@2"])]


def test_math_with_tools_scores_answers_and_tool_use(tiny_model):
    """`--tools`: the answers come from the training rollout's agent loop; a stand-in model that calls the
    calculator on the first item and guesses on the second gives the tool figures by hand."""
    import argparse
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from evals.common.suite import EvalContext
    from evals.math import _builtin_items
    from tests.scripted_model import ScriptedModel

    tok = AutoTokenizer.from_pretrained(tiny_model)
    args = argparse.Namespace(builtin_size=2, seed=0)
    items = _builtin_items("builtin:tool_math", args)
    expression = items[0]["prompt"][0]["content"].split("What is ")[1].split("?")[0]

    def script(text, turn):
        if expression in text and turn == 0:
            arguments = json.dumps({"expression": expression})
            return f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'
        if expression in text:
            return "The answer is " + text.split("<tool_response>\n")[1].split("\n")[0] + "."
        return "The answer is 7."

    gen = VLLMGenerator()
    gen.engine, gen.tokenizer = ScriptedModel(tok, script), tok
    a = argparse.Namespace(
        n=1, temperature=0.0, top_p=1.0, max_tokens=64, seed=0, tools="calculator", max_turns=3, k=None,
        answer_rule="qwen", answer_format=None, rm_scorer=None, maj_vote="string", maj_skip_unanswered=False,
    )  # fmt: skip
    records = SUITE.run_batch(items, EvalContext(a, SimpleNamespace(), generator=gen))
    assert [r["correct"] for r in records] == [[1.0], [0.0]]
    assert [r["tool_calls"] for r in records] == [[1], [0]] and [r["turns"] for r in records] == [[2], [1]]
    assert [s["role"] for s in records[0]["trajectories"][0]] == ["model", "env", "model"]
    m = SUITE.summarize(records, a)
    assert (
        m["tool_call_rate"] == 0.5
        and m["turns_mean"] == 1.5
        and m["acc"] == 0.5
        and m["tool_error_rate"] == 0
    )


@pytest.mark.slow
def test_math_with_tools_end_to_end_on_tiny_model(tiny_model, vllm_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    gen = VLLMGenerator(engine=vllm_engine)
    res = tmp_path / "res"
    argv = ["--ckpt", str(tiny_model), "--datasets", "builtin:tool_math", "--builtin-size", "3", "--tools",
            "calculator", "--max-turns", "2", "--max-tokens", "8", "--results-dir", str(res)]  # fmt: skip
    try:
        (s,) = main(SUITE, argv, generator=gen)
    finally:
        gen.load(tiny_model)
    m = s["metrics"]
    assert {"acc", "tool_call_rate", "turns_mean", "tool_calls_mean", "tool_error_rate"} <= set(m)
    rows = [json.loads(x) for x in next(res.rglob("samples.jsonl")).read_text().splitlines()]
    assert len(rows) == 3 and all(
        r["turns"][0] >= 1 and r["trajectories"][0][0]["role"] == "model" for r in rows
    )
