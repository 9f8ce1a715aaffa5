"""Inputs for the samples viewer's tests and benchmark: runs with logged samples in a real MLflow store
(written by train.samples, as training does) and eval results folders as evals/ writes them."""

from __future__ import annotations

import json
import random
from pathlib import Path

from infra.tracking import Tracker
from train.samples import sample_records, write_samples

PROMPTS = ["Give a two-digit multiple of 7.", "Give a prime number between 10 and 60."]
ANSWERS = {PROMPTS[0]: [14, 21, 28, 35, 42, 49, 56, 63], PROMPTS[1]: [11, 13, 17, 19, 23, 29, 31, 37]}


def _group_answers(prompt: str, arm: str, step: int, n: int = 8) -> list[int]:
    """DARLING keeps 8 different answers; GRPO narrows to one answer by step 30."""
    pool = ANSWERS[prompt]
    if arm == "DARLING":
        return pool[:n]
    kinds = max(1, 8 - step // 4)  # 8, 6, 3, 1 distinct answers at steps 0, 10, 20, 30
    return [pool[i % kinds] for i in range(n)]


def log_arm_run(
    experiment: str, arm: str, seed: int = 1, steps=(0, 10, 20, 30), sweep: str = "sw1", kinds=("val",)
) -> str:
    """One training run of `arm` whose samples (`kinds`: val, train) were logged at `steps`; its run id."""
    tracker = Tracker()
    combine = "multiplicative" if arm == "DARLING" else "quality"
    point = json.dumps({"reward.combine": combine, "seed": seed})
    run_id = tracker.start(
        experiment, f"{arm}-s{seed}", tags={"rlpost.sweep": sweep, "rlpost.grid_point": point}
    )
    tracker.log_params({"reward.combine": combine, "seed": seed, "experiment": experiment})
    tracker.log_metrics({"val/accuracy": 1.0}, 0)
    for step in steps:
        rows, texts, groups = [], [], []
        for g, prompt in enumerate(PROMPTS):
            gold = ",".join(map(str, ANSWERS[prompt]))
            for a in _group_answers(prompt, arm, step):
                row = {"prompt": [{"role": "user", "content": prompt}], "ground_truth": gold}
                rows.append(row | {"data_source": "multi_answer"})
                texts.append(str(a))
                groups.append(g)
        classes = {}
        partition = [
            classes.setdefault((g, t), len({k for k in classes if k[0] == g})) for g, t in zip(groups, texts)
        ]
        for kind in kinds:
            records = sample_records(
                kind, step, rows, texts, groups, [1.0] * len(texts), [1.0] * len(texts),
                {"partition_class": partition, "quality": [1.0] * len(texts)},
            )  # fmt: skip
            write_samples(tracker, kind, step, records)
    tracker.finish()
    return run_id


def math_record(
    i: int, rng: random.Random, n: int = 1, dataset: str = "math500", text_chars: int = 600
) -> dict:
    responses = [
        f"Step by step ... {'x' * rng.randint(text_chars // 2, text_chars)} so \\boxed{{{i % 7}}}"
        for _ in range(n)
    ]
    answers = [None if rng.random() < 0.1 else str(rng.randint(0, 6)) for _ in range(n)]
    return {
        "id": f"{dataset}/{i}",
        "dataset": dataset,
        "gold": str(i % 7),
        "responses": responses,
        "answers": answers,
        "correct": [float(a == str(i % 7)) for a in answers],
        "item_fingerprint": f"{i:016x}",
    }


def write_eval(
    root: Path, ckpt: str, n_items: int, seed: int = 0, run_id: str | None = None, step: int | None = None,
    datasets: tuple[str, ...] = ("math500", "gsm8k"), bad_line: bool = False, text_chars: int = 600,
) -> Path:  # fmt: skip
    """`<root>/<ckpt>/math/samples.jsonl` (+ summary.json) with `n_items` synthetic math records."""
    rng = random.Random(seed)
    folder = root / ckpt / "math"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(math_record(i, rng, dataset=datasets[i % len(datasets)], text_chars=text_chars))
        for i in range(n_items)
    ]
    if bad_line:
        lines.insert(len(lines) // 2, '{"id": "torn", "responses": ["cut mid-wri')
    (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"suite": "math", "checkpoint_name": ckpt, "run_id": run_id, "step": step, "n_items": n_items}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder / "samples.jsonl"
