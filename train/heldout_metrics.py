"""Held-out metrics of one validation pass: accuracy, pass@k for k = 1..n, and the reward's diversity figures.

Pure (no I/O): the trainer samples `data.val_n` answers per held-out prompt and hands the graded
samples here. With one greedy answer per prompt only `val/accuracy` and `val/reward_mean` are reported.
"""

from __future__ import annotations

import statistics
from collections import Counter

from math_grader.pass_at_k import pass_at_k

# reward figures worth reporting on held-out prompts -> their val/ name (NoveltyBench calls the number of
# distinct classes among k samples distinct_k)
REWARD_FIGURES = {
    "distinct_correct_mean": "distinct_correct_mean",
    "distinct_classes_mean": "distinct_k",
    # multi-turn: different tool paths among a prompt's correct samples (train/diversity/strategy.py)
    "distinct_correct_strategies_mean": "distinct_correct_strategies_mean",
}


def heldout_metrics(
    scores: list[float],
    correct: list[float] | None,
    group_index: list[int],
    reward_figures: dict[str, float] | None = None,
) -> dict[str, float]:
    """`val/*` metrics. scores, correct, group_index: (B,) per sample, a prompt's samples share a group id.

    pass@k uses the unbiased estimator over each prompt's n samples, averaged over prompts; the reward's
    per-group figures (already group means) are passed through under REWARD_FIGURES' names.
    """
    out = {"val/reward_mean": statistics.fmean(scores)}
    if correct is None:
        return out
    out["val/accuracy"] = statistics.fmean(correct)
    sizes = Counter(group_index)
    n = min(sizes.values())
    if n > 1:
        hits = Counter(g for g, c in zip(group_index, correct) if c == 1.0)
        for k in range(1, n + 1):
            out[f"val/pass_at_{k}"] = statistics.fmean(pass_at_k(sizes[g], hits[g], k) for g in sizes)
        for key, name in REWARD_FIGURES.items():
            if key in (reward_figures or {}):
                out[f"val/{name}"] = float(reward_figures[key])
    return out
