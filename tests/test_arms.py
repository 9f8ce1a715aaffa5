"""Arm comparison on hand-computed values (t CIs, paired differences, verdict lines), arm assignment from
the experiment files, the arm leaderboard and the report's answer, from a real MLflow store."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import arms as A
from analysis import leaderboard as lb
from analysis.arms import load_arm_runs
from analysis.report import build_report, headline_metrics
from analysis.store import AnalysisError, add_last_steps_means
from tests.analysis_store import darling_vs_grpo_store, log_run

T2 = 4.302652729911275  # t_{0.975, 2}
T1 = 12.706204736174698  # t_{0.975, 1}


def test_t_interval_by_hand():
    e = A.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1
    assert (e.mean, e.n) == (2.0, 3)
    assert e.lo == pytest.approx(2 - T2 / math.sqrt(3)) and e.hi == pytest.approx(2 + T2 / math.sqrt(3))
    e = A.t_interval([0.2, 0.4, math.nan])  # NaN dropped; sd 0.1414
    assert e.n == 2 and e.hi - e.mean == pytest.approx(T1 * math.sqrt(0.02) / math.sqrt(2))
    one = A.t_interval([0.7])
    assert one.mean == 0.7 and math.isnan(one.lo) and one.text() == "0.7 (one seed)"
    assert A.t_interval([]).n == 0 and A.t_interval([]).text() == "-"


def test_paired_difference_and_verdicts_by_hand():
    darling = {"s1": 0.5, "s2": 0.7, "s3": 0.6, "s4": 0.9}
    grpo = {"s1": 0.3, "s2": 0.4, "s3": 0.35}  # s4 has no pair: left out
    d = A.paired_difference(darling, grpo)  # 0.2, 0.3, 0.25: mean 0.25, sd 0.05
    half = T2 * 0.05 / math.sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(0.25) and d.lo == pytest.approx(0.25 - half)
    assert A.verdict("val/accuracy", "DARLING", "GRPO", d) == (
        "val/accuracy: DARLING higher than GRPO by 0.25 [+0.126, +0.374], 3 seeds"
    )
    lower = A.paired_difference(grpo, darling)
    assert A.verdict("m", "GRPO", "DARLING", lower).startswith(
        "m: GRPO lower than DARLING by 0.25 [-0.374, -0.126]"
    )
    noisy = A.paired_difference(
        {"a": 0.5, "b": 0.3, "c": 0.4}, {"a": 0.4, "b": 0.4, "c": 0.4}
    )  # +0.1, -0.1, 0
    assert (
        A.verdict("m", "X", "Y", noisy)
        == "m: no difference beyond noise (X - Y = +0 [-0.248, +0.248], 3 seeds)"
    )
    assert "on one seed (an interval needs 3 or more seeds)" in A.verdict(
        "m", "X", "Y", A.paired_difference({"a": 1.0}, {"a": 0.5})
    )
    assert A.verdict("m", "X", "Y", A.paired_difference({}, {"a": 0.5})) == "m: no paired runs of X and Y"


def test_arms_come_from_the_experiment_files():
    assert A.experiment_arms("darling_math") == {
        "DARLING": {"reward.combine": "multiplicative"},
        "GRPO": {"reward.combine": "quality"},
    }
    assert list(A.experiment_arms("classmate_sycophancy")) == ["Classmate", "GRPO"]
    assert A.experiment_arms("no_such_experiment_file") == {}
    arms = A.experiment_arms("darling_math")
    assert A.arm_of({"reward.combine": "quality", "seed": 2}, {}, arms) == "GRPO"
    assert A.arm_of({"seed": 2}, {"reward.combine": "multiplicative"}, arms) == "DARLING"  # from params
    assert A.arm_of({"reward.combine": "additive"}, {}, arms) is None
    assert A.arm_of({"optim.lr": "5e-05"}, {}, {"fast": {"optim.lr": 5.0e-5}}) == "fast"  # typed vs text
    assert A.pair_key({"reward.combine": "quality", "seed": 2}, arms) == '{"seed": 2}'


def test_bad_arms_are_one_line(tmp_path, monkeypatch):
    import train.config

    (tmp_path / "bad.yaml").write_text("arms:\n  DARLING: multiplicative\n")
    monkeypatch.setattr(train.config, "EXPERIMENTS_DIR", tmp_path)
    with pytest.raises(AnalysisError, match=r"arms \['DARLING'\] must each map grid keys to values") as info:
        A.experiment_arms("bad")
    assert "\n" not in str(info.value)


def test_runs_without_declared_arms_get_one_arm_per_grid_point():
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "group": ["lr=1", "lr=2", "lr=1"],
            "grid_point": ['{"lr": 1, "seed": 1}', '{"lr": 2, "seed": 1}', '{"lr": 1, "seed": 2}'],
            "m": [0.1, 0.2, 0.3],
        }
    )
    table = A.with_arms(runs, {})
    assert list(table["arm"]) == ["lr=1", "lr=2", "lr=1"]
    assert list(table["pair"]) == ['{"seed": 1}', '{"seed": 1}', '{"seed": 2}']
    assert A.arm_order(table, {}) == ["lr=1", "lr=2"]
    (c,) = A.comparisons(table, ["m"], ["lr=1", "lr=2"])
    assert c["diff"].n == 1 and c["diff"].mean == pytest.approx(-0.1)


def test_arm_view_from_a_real_store(mlflow_uri, tmp_path, capsys):
    darling_vs_grpo_store()
    log_run("darling_math", "other-arm", {"reward.combine": "additive", "seed": 1}, {"train/accuracy": [0.9]})
    runs, arms = load_arm_runs("darling_math")
    assert len(runs) == 4 and sorted(runs["arm"]) == [
        "DARLING",
        "DARLING",
        "GRPO",
        "GRPO",
    ]  # additive: no arm
    board = lb.by_arm(runs, arms, ["train/accuracy"])
    # final train accuracy: darling 0.34 / 0.39, grpo 0.36 / 0.41 (0.2 + 0.05 seed [+0.02] + 0.09)
    assert board.rows == ["DARLING (n=2)", "GRPO (n=2)"]
    assert board.values["train/accuracy"].tolist() == pytest.approx([0.365, 0.385])
    assert board.hi["train/accuracy"].isna().all()  # 2 seeds: no interval (t_1 = 12.7 would reach past 1)
    assert lb.to_markdown(board).splitlines()[2] == "| DARLING (n=2) | 0.365 |"
    assert lb.main(["--experiment", "darling_math", "--by", "arm", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "leaderboard_darling_math_arms.md").read_text().startswith("| arm | ")
    assert lb.main(["--by", "arm", "--out", str(tmp_path)]) == 2
    assert "--by arm needs an experiment" in capsys.readouterr().err

    ends = add_last_steps_means(runs, ["train/accuracy"], k=2)
    # darling seed 1: accuracy 0.25, 0.28, 0.31, 0.34 -> first two 0.265, last two 0.325
    row = ends[ends["run_name"] == "darling_math-darling-s1"].iloc[0]
    assert row["train/accuracy@first2"] == pytest.approx(0.265) and row[
        "train/accuracy@last2"
    ] == pytest.approx(0.325)


def test_report_answers_the_question(mlflow_uri, tmp_path):
    darling_vs_grpo_store()
    page = build_report("darling_math", tmp_path / "rep")
    text = page.read_text()
    assert text.index("<h2>Headline</h2>") < text.index("Leaderboard (latest value per run)")
    assert "Does DARLING differ from GRPO?" in text
    # distinct classes: darling 3.5 + 0.1 s, grpo 2.0 + 0.1 s in both seeds -> paired differences 1.5, 1.5
    line = (
        "reward/distinct_classes_mean@last5: DARLING higher than GRPO in both seeds (+1.5, +1.5); "
        "an interval needs 3 or more seeds"
    )
    comparison = pd.read_csv(tmp_path / "rep" / "comparison.csv")
    row = comparison[comparison["metric"] == "reward/distinct_classes_mean@last5"].iloc[0]
    assert (row["diff"], row["n"], row["verdict"], row["seeds"]) == pytest.approx((1.5, 2, line, "1.5 1.5"))
    assert math.isnan(row["ci_lo"])
    # accuracy: grpo is 0.02 above darling in both seeds
    acc = comparison[comparison["metric"] == "train/accuracy@last5"].iloc[0]
    assert acc["verdict"].startswith(
        "train/accuracy@last5: DARLING lower than GRPO in both seeds (-0.02, -0.02)"
    )
    # no val/* in this store: the declared headline metrics are named as missing, the rest reported
    assert "headline metric &#x27;val/distinct_correct_mean&#x27;" in text and "higher in both seeds" in text
    arms_csv = pd.read_csv(tmp_path / "rep" / "arms.csv")
    acc = arms_csv[(arms_csv["arm"] == "GRPO") & (arms_csv["metric"] == "train/accuracy@last5")].iloc[0]
    assert acc["mean"] == pytest.approx((0.2 + 0.05 + 0.02 + 0.045 + 0.2 + 0.1 + 0.02 + 0.045) / 2)
    imgs = sorted(p.name for p in (tmp_path / "rep" / "fig").glob("arm_*.png"))
    assert imgs and all(f'src="fig/{n}"' in text for n in imgs)


def test_headline_metrics_order():
    table = pd.DataFrame(
        columns=["run_id", "val/pass_at_10", "val/pass_at_2", "val/accuracy", "val/reward_mean",
                 "val/distinct_k", "eval/math/acc", "train/accuracy@last5", "train/accuracy@first5"]
    )  # fmt: skip
    assert headline_metrics(table) == [
        "val/accuracy", "val/pass_at_2", "val/pass_at_10", "val/distinct_k", "eval/math/acc",
        "train/accuracy@first5", "train/accuracy@last5",
    ]  # fmt: skip


def test_select_runs_takes_the_newest_sweep_and_one_run_per_arm_and_seed():
    t = pd.to_datetime
    table = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d", "e"],
            "sweep": ["old", "old", "new", "new", ""],
            "arm": ["DARLING", "GRPO", "DARLING", "DARLING", "GRPO"],
            "pair": ["1", "1", "1", "1", "2"],
            "start_time": [
                t("2026-01-01"),
                t("2026-01-02"),
                t("2026-02-01"),
                t("2026-02-02"),
                t("2026-03-01"),
            ],
        }
    )
    # default: the newest sweep only (the untagged run is not a sweep), "d" re-ran "c"'s point
    assert list(A.select_runs(table)["run_id"]) == ["d"]
    # every run: one per (arm, pair), the newest
    assert sorted(A.select_runs(table, "all")["run_id"]) == ["b", "d", "e"]
    assert list(A.select_runs(table[table["sweep"] == ""])["run_id"]) == ["e"]  # no sweeps at all


def test_a_second_sweep_of_the_experiment_does_not_mix_into_the_report(mlflow_uri, tmp_path):
    darling_vs_grpo_store()  # sweep s1
    for combine, value in (("multiplicative", 0.9), ("quality", 0.1)):  # s2: another config, seed 1 only
        point = {"reward.combine": combine, "seed": 1}
        log_run("darling_math", f"{combine}-again", point, {"train/accuracy": [value]}, sweep="s2")
    newest, _ = load_arm_runs("darling_math")
    assert sorted(newest["train/accuracy"]) == [0.1, 0.9] and set(newest["sweep"]) == {"s2"}
    first, _ = load_arm_runs("darling_math", sweep="s1")
    assert len(first) == 4 and set(first["sweep"]) == {"s1"}
    every, _ = load_arm_runs("darling_math", sweep="all")
    assert len(every) == 4 and sorted(every["sweep"]) == ["s1", "s1", "s2", "s2"]  # seed 1 re-run: once
    for sweep in (None, "all"):  # before: duplicate (arm, seed) rows broke the per-seed column
        page = build_report("darling_math", tmp_path / f"rep-{sweep}", sweep=sweep).read_text()
        assert "<h2>Headline</h2>" in page and "Does DARLING differ from GRPO?" in page
