"""Leaderboard and report from a real MLflow store: best marking, CIs, mixed metric sets, bad input."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from analysis import leaderboard as lb
from analysis.report import build_report
from analysis.store import AnalysisError, group_label, load_runs
from tests.analysis_store import darling_vs_grpo_store, log_run


def test_build_marks_best_per_column_and_formats_ci():
    table = pd.DataFrame(
        {
            "run_name": ["a", "b", "c"],
            "eval/math/acc": [0.2, 0.5, math.nan],
            "eval/math/acc_ci_lo": [0.1, 0.4, math.nan],
            "eval/math/acc_ci_hi": [0.3, 0.6, math.nan],
            "eval/sycophancy/flip_rate": [0.4, 0.1, 0.3],
            "eval/novelty/distinct": [math.nan, math.nan, math.nan],
        }
    )
    board = lb.build(table)
    assert board.best == {"eval/math/acc": 1, "eval/sycophancy/flip_rate": 1, "eval/novelty/distinct": None}
    md = lb.to_markdown(board).splitlines()
    assert md[0] == "| run | eval/math/acc | eval/sycophancy/flip_rate | eval/novelty/distinct |"
    assert md[2] == "| a | 0.2 [0.1, 0.3] | 0.4 |  |"
    assert md[3] == "| b | **0.5 [0.4, 0.6]** | **0.1** |  |"
    assert md[4] == "| c |  | 0.3 |  |"
    csv = lb.to_csv(board).splitlines()
    assert (
        csv[0]
        == "run,eval/math/acc,eval/math/acc_ci_lo,eval/math/acc_ci_hi,eval/sycophancy/flip_rate,eval/novelty/distinct"
    )
    tex = lb.to_latex(board)
    assert "\\textbf{0.5 [0.4, 0.6]}" in tex and "flip\\_rate" in tex and "flip_rate" not in tex
    assert 'class="best"><b>0.5 [0.4, 0.6]</b>' in lb.to_html(board)


def test_creative_writing_rating_is_the_first_column_with_its_ci():
    table = pd.DataFrame(
        {
            "run_name": ["a", "b"],
            "eval/math/acc": [0.2, 0.5],
            "eval/creative_writing/rating": [1250.0, 1150.0],
            "eval/creative_writing/rating_ci_lo": [1000.0, 900.0],
            "eval/creative_writing/rating_ci_hi": [1500.0, 1400.0],
        }
    )
    board = lb.build(table)
    assert list(board.values.columns) == ["eval/creative_writing/rating", "eval/math/acc"]
    assert board.best["eval/creative_writing/rating"] == 0
    assert lb.to_markdown(board).splitlines()[2].startswith("| a | **1250 [1000, 1500]** |")


def test_group_label_drops_the_seed():
    assert group_label('{"reward": "darling", "seed": 2}', "x") == "reward=darling"
    assert group_label('{"algorithm.adv_estimator": "rloo", "seed": 1}', "x") == "adv_estimator=rloo"
    assert group_label(None, "run-7") == "run-7"


def test_leaderboard_from_store_with_mixed_metrics(mlflow_uri, tmp_path):
    darling_vs_grpo_store()
    log_run("darling_math", "no-evals", None, {"train/accuracy": [0.1]})
    runs = load_runs("darling_math")
    assert len(runs) == 5 and set(runs["group"]) >= {"combine=multiplicative", "combine=quality", "no-evals"}
    board = lb.leaderboard("darling_math")
    names = board.rows
    assert "eval/novelty/distinct" in board.values.columns and "eval/math/acc" in board.values.columns
    empty_row = names.index("no-evals")
    assert (
        lb.to_markdown(board).splitlines()[2 + empty_row].count("|  |") >= 1
    )  # missing metrics: empty cells
    best_distinct = names[board.best["eval/novelty/distinct"]]
    assert "darling" in best_distinct
    per_ckpt = lb.leaderboard("darling_math", per="checkpoint")
    assert len(per_ckpt.rows) == 8 and per_ckpt.rows[0].endswith("@2")
    assert lb.main(["--experiment", "darling_math", "--out", str(tmp_path / "r")]) == 0
    assert {p.suffix for p in (tmp_path / "r").iterdir()} == {".md", ".html", ".csv", ".tex"}


def test_empty_store_and_unknown_experiment(mlflow_uri, tmp_path, capsys):
    board = lb.leaderboard()
    assert board.rows == [] and "(no runs)" in lb.to_markdown(board)
    with pytest.raises(AnalysisError, match="unknown MLflow experiment 'nope'"):
        load_runs("nope")
    assert lb.main(["--experiment", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown MLflow experiment" in capsys.readouterr().err


def test_report_writes_page_and_figures(mlflow_uri, tmp_path):
    darling_vs_grpo_store()
    page = build_report("darling_math", tmp_path / "rep")
    text = page.read_text()
    for title in ("Training curves", "Eval metrics against checkpoint step", "Diversity vs quality",
                  "NoveltyBench by category", "Leaderboard per checkpoint"):  # fmt: skip
        assert title in text, title
    imgs = sorted(p.name for p in (tmp_path / "rep" / "fig").glob("*.png"))
    assert "diversity_quality.png" in imgs and "novelty_distinct.png" in imgs
    assert all(f'src="fig/{name}"' in text for name in imgs)
    # opens offline: nothing from the network; the only links go to the local samples viewer (analysis.view)
    assert not re.findall(r"https?://(?!127\.0\.0\.1:8765/)", text)


def test_a_sparse_curve_is_drawn_as_logged_and_a_per_step_one_smoothed():
    from analysis import figures

    hist = pd.DataFrame(
        {
            "run_id": ["r"] * 6,
            "key": ["val/accuracy"] * 2 + ["train/accuracy"] * 4,
            "step": [0, 30, 1, 2, 3, 4],
            "value": [0.5, 0.9, 0.0, 1.0, 0.0, 1.0],
        }
    )
    runs = pd.DataFrame({"run_id": ["r"], "run_name": ["r"], "group": ["g"], "arm": ["A"]})
    val = figures.arm_curves(hist, runs, "val/accuracy", ["A"], smooth=3)
    assert list(val.axes[0].lines[0].get_ydata()) == [0.5, 0.9]  # not (0.5 + 0.9) / 2 at step 30
    assert "rolling" not in val.axes[0].get_title()
    train = figures.curves(hist, runs, "train/accuracy", smooth=3)
    assert list(train.axes[0].lines[0].get_ydata()) == pytest.approx([0.0, 0.5, 1 / 3, 2 / 3])
