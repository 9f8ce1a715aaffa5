"""Logged samples: a training step's (or a validation's) prompts, answers and reward parts, kept on the run.

Scalars say which arm wins; samples show why (GRPO's groups collapsing onto one answer, DARLING's
staying spread). Every `log_samples_every` steps (and at step 1) the step's first `TRAIN_GROUPS` groups,
and at every validation all held-out groups, are written as one JSONL artifact of the MLflow run,
`samples/<kind>/<step, 6 digits>.jsonl` (kind: train | val; e.g. samples/val/000010.jsonl), one record per group:

    {"kind", "step", "group", "prompt" (last user turn), "data_source", "gold",
     "responses": [{"text", "answer" (the math grader's extraction), "reward", "correct",
                    "class" (the partition's class in the group), "quality", "diversity",
                    "advantage" (mean over the response tokens), "length", "finish", <scalar signals>}]}

plus the same rows flattened as an MLflow table (`samples/<kind>/<step>.table.json`, text and gold
cut), which the MLflow UI shows. `python -m analysis.view` reads the JSONL files. Only rank
0 logs (its share of the prompts); a failed write is a one-line warning, never a failed step.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from infra.tracking import SAMPLES_ARTIFACT_DIR
from math_grader import extract_answer

if TYPE_CHECKING:
    import torch

TRAIN_GROUPS = 8  # groups kept per logged training step (all validation groups are kept)
TABLE_TEXT_CHARS = 2000  # the MLflow table's copy of a response is cut here (the JSONL keeps it whole)
TABLE_GOLD_CHARS = 200  # and of the gold, repeated on every row (multi-answer golds list every answer)
# reward signals renamed in the records; other per-response scalar signals keep their names
SIGNAL_FIELDS = {"partition_class": "class", "quality": "quality", "diversity": "diversity"}


def due(step: int, every: int) -> bool:
    """Training samples are kept at step 1 (the start) and every `every` steps; `every` <= 0: never."""
    return every > 0 and (step == 1 or step % every == 0)


def response_means(values: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """Per-row mean of `values` (N, T) over the response tokens `mask` (N, T): one advantage per response."""
    return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).tolist()


def _prompt_text(prompt) -> str:
    """The last user turn of a chat prompt (the question; earlier turns are few-shot context)."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1] if users else prompt)


def _scalar(value) -> bool:
    return value is None or isinstance(value, (int, float, bool))


def _group_record(kind: str, step: int, group: int, row: dict, gold: str | None) -> dict:
    """A group's record before its responses: where it comes from, its prompt and gold answer."""
    return {
        "kind": kind,
        "step": step,
        "group": group,
        "prompt": _prompt_text(row.get("prompt", "")),
        "data_source": str(row.get("data_source", "")),
        "gold": gold,
        "responses": [],
    }


def sample_records(
    kind: str,
    step: int,
    rows: list[dict],
    texts: list[str],
    group_index: list[int],
    scores: list[float],
    correct: list[float] | None = None,
    signals: dict[str, list] | None = None,
    advantages: list[float] | None = None,
    lengths: list[int] | None = None,
    finish_reasons: list[str] | None = None,
    max_groups: int | None = None,
    episodes: list[dict] | None = None,
) -> list[dict]:
    """One record per group (in order of first appearance; the first `max_groups`), its responses in order.

    `rows`: the data row of each response (prompt, ground_truth, data_source). Per-response lists all
    have one entry per response; `signals` are the reward's, of which the scalar ones are kept."""
    kept = list(dict.fromkeys(group_index))[:max_groups]
    wanted = set(kept)
    by_group: dict[int, dict] = {}
    scalar_signals = {
        k: v for k, v in (signals or {}).items() if len(v) == len(texts) and all(map(_scalar, v))
    }
    for i, g in enumerate(group_index):
        if g not in wanted:
            continue
        row = rows[i]
        gold = str(row.get("ground_truth", "") or "").strip() or None
        record = by_group.get(g)
        if record is None:
            record = by_group[g] = _group_record(kind, step, kept.index(g), row, gold)
        response = {
            "text": texts[i],
            "answer": extract_answer(texts[i]) if gold is not None else None,
            "reward": float(scores[i]),
            "correct": None if correct is None else float(correct[i]),
        }
        for name, values in scalar_signals.items():
            response[SIGNAL_FIELDS.get(name, name)] = values[i]
        if advantages is not None:
            response["advantage"] = float(advantages[i])
        if lengths is not None:
            response["length"] = int(lengths[i])
        if finish_reasons is not None:
            response["finish"] = finish_reasons[i]
        if episodes:  # multi-turn: each turn in order, the model's and the environment's told apart
            ep = episodes[i]
            response["turns"] = [{"role": s["role"], "text": s["text"]} for s in ep["segments"]]
            response["tool_calls"], response["stop"] = ep["tool_calls"], ep["stop"]
        record["responses"].append(response)
    return [by_group[g] for g in kept]


def table_rows(records: list[dict]) -> dict[str, list]:
    """The records flattened to columns (one row per response) for `MlflowClient.log_table`."""
    rows = [
        {"step": r["step"], "group": r["group"], "prompt": r["prompt"], "gold": r["gold"], **resp}
        for r in records
        for resp in r["responses"]
    ]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    table = {c: [row.get(c) for row in rows] for c in columns}
    table["text"] = [t[:TABLE_TEXT_CHARS] for t in table.get("text", [])]
    table["gold"] = [None if g is None else g[:TABLE_GOLD_CHARS] for g in table.get("gold", [])]
    return table


def write_samples(tracker, kind: str, step: int, records: list[dict]) -> None:
    """Log `records` as `samples/<kind>/<step>.jsonl` (and its table) on the tracker's run.

    A recomputed step (a resumed run) overwrites its own file. A failure is a warning: samples are a
    view on the run, never a reason to lose its training."""
    if not records or not getattr(tracker, "enabled", False) or tracker.run_id is None:
        return
    name = f"{step:06d}"
    try:
        with tempfile.TemporaryDirectory(prefix="rlpost-samples-") as tmp:
            path = Path(tmp) / f"{name}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            tracker.client.log_artifact(tracker.run_id, str(path), f"{SAMPLES_ARTIFACT_DIR}/{kind}")
        tracker.client.log_table(
            tracker.run_id, table_rows(records), f"{SAMPLES_ARTIFACT_DIR}/{kind}/{name}.table.json"
        )
    except Exception as exc:  # noqa: BLE001 - any store failure: warn and train on
        print(f"warning: {kind} samples of step {step} not logged to MLflow: {exc}", file=sys.stderr)


def log_rollout(
    tracker,
    kind: str,
    step: int,
    rows: list[dict],
    rollout,
    reward,
    advantages: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    every: int = 1,
) -> None:
    """The trainer's one call: build and log the records of this rollout when `kind` is val or the step
    is `due` (`rows`: the data row of each response; `advantages`, `mask`: (N, T) of the update)."""
    if not getattr(tracker, "enabled", False) or (kind == "train" and not due(step, every)):
        return
    records = sample_records(
        kind,
        step,
        rows,
        rollout.texts,
        rollout.group_index,
        reward.scores,
        reward.correct,
        reward.signals,
        None if advantages is None else response_means(advantages, mask),
        [len(r) for r in rollout.response_ids],
        rollout.finish_reasons,
        max_groups=TRAIN_GROUPS if kind == "train" else None,
        episodes=getattr(rollout, "episodes", None),
    )
    write_samples(tracker, kind, step, records)
