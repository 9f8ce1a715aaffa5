"""Builds small real MLflow stores for the analysis tests (through infra.tracking.Tracker, as training does)."""

from __future__ import annotations

import json
import math

from infra.tracking import Tracker


def log_run(
    experiment: str,
    name: str,
    grid_point: dict | None,
    series: dict[str, list[float]],
    evals: dict[int, dict[str, float]] | None = None,
    sweep: str = "s1",
    params: dict | None = None,
) -> str:
    """One child run: `series` metrics at steps 1..len, `evals` {step: {eval/...: value}}, extra `params`."""
    t = Tracker()
    tags = {"rlpost.sweep": sweep, "rlpost.kind": "train"}
    if grid_point is not None:
        tags["rlpost.grid_point"] = json.dumps(grid_point)
    run_id = t.start(experiment, name, tags=tags)
    t.log_params({"seed": (grid_point or {}).get("seed", 0), "optim.lr": 1e-5, **(params or {})})
    steps = max((len(v) for v in series.values()), default=0)
    for s in range(steps):
        t.log_metrics({k: v[s] for k, v in series.items() if s < len(v)}, step=s + 1)
    for step, metrics in (evals or {}).items():
        t.client.log_batch(run_id, metrics=[_metric(k, v, step) for k, v in metrics.items()])
    t.finish()
    return run_id


def _metric(key, value, step):
    import time

    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), step)


COMBINE = {"darling": "multiplicative", "grpo": "quality"}  # the grid values of darling_math.yaml's arms


def darling_vs_grpo_store(experiment: str = "darling_math") -> dict[str, str]:
    """Four runs (darling/grpo x seeds 1, 2) with training curves and eval metrics at steps 2 and 4; grid
    points as darling_math's sweep writes them, so its `arms:` (DARLING, GRPO) apply."""
    ids = {}
    for reward in ("darling", "grpo"):
        for seed in (1, 2):
            base = 0.2 + 0.05 * seed + (0.02 if reward == "grpo" else 0.0)
            acc = [base + 0.03 * s for s in range(4)]
            distinct = [2.0 + (1.5 if reward == "darling" else 0.0) + 0.1 * s for s in range(4)]
            evals = {}
            for step in (2, 4):
                evals[step] = {
                    "eval/math/acc": acc[step - 1],
                    "eval/math/acc_ci_lo": acc[step - 1] - 0.05,
                    "eval/math/acc_ci_hi": acc[step - 1] + 0.05,
                    "eval/novelty/distinct": distinct[step - 1] + 1,
                    "eval/novelty/utility": 3.0 + seed * 0.1,
                    "eval/novelty/distinct/creativity": distinct[step - 1] + 2,
                    "eval/novelty/distinct/knowledge": distinct[step - 1],
                    "eval/novelty/utility/creativity": 3.5,
                    "eval/novelty/utility/knowledge": 2.5,
                }
            if reward == "grpo" and seed == 2:
                evals = {
                    s: {k: v for k, v in m.items() if not k.startswith("eval/novelty")}
                    for s, m in evals.items()
                }
            ids[f"{reward}-s{seed}"] = log_run(
                experiment,
                f"{experiment}-{reward}-s{seed}",
                {"reward.combine": COMBINE[reward], "seed": seed},
                {
                    "train/accuracy": acc,
                    "train/reward_mean": acc,
                    "reward/distinct_classes_mean": distinct,
                    "timing/step_s": [10.0 + math.sin(s) for s in range(4)],
                },
                evals,
            )
    return ids


# darling_math's held-out figures per seed: (DARLING accuracy, GRPO accuracy, DARLING distinct, GRPO distinct)
# at the end; seed 3's accuracies make a 3-seed t interval reach past 1.0 (clipped on the page).
HELD_OUT = {1: (0.92, 0.96, 5.5, 1.5), 2: (0.96, 0.99, 5.1, 2.4), 3: (0.86, 0.97, 5.4, 1.2)}


def darling_math_store(seeds: tuple[int, ...] = (1, 2), steps: int = 8, sweep: str = "s1") -> dict[str, str]:
    """DARLING and GRPO runs as darling_math's sweep logs them: training curves for `steps` steps and the
    held-out figures (val/accuracy, val/pass_at_1..8 with pass_at_1 = accuracy, val/distinct_correct_mean,
    val/distinct_k) at step 0 and at the end, params data.val_n = rollout.n = 8."""
    ids = {}
    for arm, combine in (("darling", "multiplicative"), ("grpo", "quality")):
        for seed in seeds:
            acc_d, acc_g, dist_d, dist_g = HELD_OUT[seed]
            acc, distinct = (acc_d, dist_d) if arm == "darling" else (acc_g, dist_g)
            start = {
                "val/accuracy": 0.7,
                "val/distinct_correct_mean": 4.4 + 0.1 * seed,
                "val/distinct_k": 5.0,
            }
            end = {
                "val/accuracy": acc,
                "val/distinct_correct_mean": distinct,
                "val/distinct_k": distinct + 0.5,
            }
            evals = {}
            for step, vals in ((0, start), (steps, end)):
                a = vals["val/accuracy"]
                passes = {f"val/pass_at_{k}": 1 - (1 - a) ** k for k in range(1, 9)}  # pass_at_1 == accuracy
                evals[step] = {**vals, **passes, "val/reward_mean": a}
            train_acc = [0.67 + (acc - 0.67) * s / (steps - 1) for s in range(steps)]
            train_distinct = [
                4.4 + (distinct - 4.4) * s / (steps - 1) + 0.3 * (-1) ** (s + seed) for s in range(steps)
            ]
            ids[f"{arm}-s{seed}"] = log_run(
                "darling_math",
                f"darling_math-{arm}-s{seed}",
                {"reward.combine": combine, "seed": seed},
                {
                    "train/accuracy": train_acc,
                    "reward/distinct_correct_mean": train_distinct,
                    "reward/distinct_classes_mean": [v + 0.5 for v in train_distinct],
                },
                evals,
                sweep=sweep,
                params={"data.val_n": 8, "rollout.n": 8, "reward.combine": combine},
            )
    return ids


# tool_math's held-out figures per arm: (val/accuracy, val/tool_call_rate) per seed 1, 2, 3 at step 0 (after
# the warm-up, before RL), step 10 and step 20 (the end). Changes end - start: calculator accuracy +0.5, +0.45,
# +0.4 (mean 0.45, sd 0.05), tool-call rate +0.5, +0.55, +0.6; broken_calculator accuracy +0.05, 0, -0.05,
# tool-call rate -0.3, -0.2, -0.4 (mean -0.3, sd 0.1); no_tools accuracy 0, +0.05, -0.05, tool-call rate 0.
TOOL_MATH_VAL = {
    "calculator": {0: ([0.30, 0.25, 0.35], [0.4, 0.4, 0.4]), 10: ([0.5, 0.5, 0.5], [0.6, 0.7, 0.8]),
                   20: ([0.80, 0.70, 0.75], [0.9, 0.95, 1.0])},
    "broken_calculator": {0: ([0.30, 0.25, 0.35], [0.4, 0.4, 0.4]), 10: ([0.3, 0.3, 0.3], [0.3, 0.3, 0.3]),
                          20: ([0.35, 0.25, 0.30], [0.1, 0.2, 0.0])},
    "no_tools": {0: ([0.05, 0.0, 0.1], [0.0, 0.0, 0.0]), 10: ([0.05, 0.05, 0.05], [0.0, 0.0, 0.0]),
                 20: ([0.05, 0.05, 0.05], [0.0, 0.0, 0.0])},
}  # fmt: skip
TOOLS = {"calculator": "calculator", "broken_calculator": "broken_calculator", "no_tools": "none"}


def tool_math_store(steps: int = 20, sweep: str = "s1") -> dict[str, str]:
    """tool_math's 3 arms x 3 seeds as its sweep logs them: grid points {grpo.env.tools, grpo.seed}, training
    curves for `steps` steps, and TOOL_MATH_VAL's val/accuracy, val/tool_call_rate, val/turns_mean at steps
    0, 10 and `steps`, params data.val_n = 4; run ids by "<arm>-s<seed>"."""
    ids = {}
    for arm, by_step in TOOL_MATH_VAL.items():
        for i, seed in enumerate((1, 2, 3)):
            evals = {
                step: {
                    "val/accuracy": acc[i],
                    "val/tool_call_rate": rate[i],
                    "val/turns_mean": 1 + rate[i],
                }
                for step, (acc, rate) in zip((0, 10, steps), by_step.values())
            }
            start, end = by_step[0][0][i], by_step[20][0][i]
            ids[f"{arm}-s{seed}"] = log_run(
                "tool_math",
                f"tool_math-{arm}-s{seed}",
                {"grpo.env.tools": TOOLS[arm], "grpo.seed": seed},
                {"train/accuracy": [start + (end - start) * s / (steps - 1) for s in range(steps)]},
                evals,
                sweep=sweep,
                params={"data.val_n": 4, "rollout.n": 4, "env.tools": TOOLS[arm]},
            )
    return ids
