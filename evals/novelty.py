"""NoveltyBench: how many meaningfully different, good answers a model gives to one prompt (docs/evals.md).

Per prompt: k = 10 samples at T = 1 (max 512 tokens); a greedy partition in generation order with the
SAME partitioner DARLING trains with (`train.diversity.partition`, mode "greedy") and a configurable
judge (default: the offline embedding judge); a quality rating 1..10 for each generation that opens a new
class (others score 0); then

- distinct_k = number of classes (not classes - 1, an old upstream slip);
- utility_k = (1 - p) / (1 - p^k) * sum_i p^(i-1) * u_i with p = 0.8 (one class rated 10, k = 10: 2.2406).

Quality comes from the scorer interface (`train.rewards.scorers`): a reward model's raw score r is mapped
to bisect_left(T, r) + 1 with NoveltyBench's thresholds T (calibrated on Skywork-Reward-Gemma-2-27B-v0.2),
an LLM judge's own 1-10 rating is used as is. Without `--quality`, only distinct_k is reported.

    python -m evals.novelty --ckpt latest --data ../shared/data/novelty-bench/curated.jsonl
    python -m evals.novelty --ckpt RUN_ID --data ../shared/data/novelty-bench/wildchat-1k.jsonl \\
        --judge '{"_target_": "train.diversity.judges.PairClassifierJudge", "model_path": "DIR",
                  "threshold": 0.102, "max_length": 256}' \\
        --quality '{"_target_": "train.rewards.scorers.RewardModelScorer", "model_path": "RM_DIR"}'
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
from collections import defaultdict

from evals.common.cli import EvalError, main
from evals.common.generation import Sampling
from evals.common.suite import EvalContext

# NoveltyBench's reward-model thresholds: rating = bisect_left(T, r) + 1 in 1..10.
REWARD_THRESHOLDS: tuple[float, ...] = (
    -7.71875, -6.28125, -6.0, -5.71875, -5.5, -5.0, -4.375, -3.4375, -2.046875,
)  # fmt: skip
BUILTIN_EVAL_SIZE = 200  # held-out prompts taken from a builtin: dataset
PATIENCE = 0.8
DEFAULT_JUDGE = {"_target_": "train.diversity.judges.EmbeddingJudge"}


# ---- metrics (pure) ------------------------------------------------------------------------------


def rating_from_reward(reward: float, thresholds: tuple[float, ...] = REWARD_THRESHOLDS) -> int:
    """Reward-model score -> rating 1..len(thresholds)+1: bisect_left(thresholds, reward) + 1."""
    return bisect.bisect_left(thresholds, reward) + 1


def novelty_scores(classes: list[int], ratings: list[float | None]) -> list[float]:
    """Per generation (k,): its rating if it opens a new class (first of its class in order), else 0.

    ``classes`` (k,) class id per generation; ``ratings`` (k,) may hold None for generations that do not
    open a class (they were not rated).
    """
    if len(classes) != len(ratings):
        raise ValueError(f"{len(classes)} class ids but {len(ratings)} ratings")
    seen: set[int] = set()
    out = []
    for c, r in zip(classes, ratings):
        if c in seen:
            out.append(0.0)
            continue
        seen.add(c)
        if r is None:
            raise ValueError(f"generation opening class {c} has no rating")
        out.append(float(r))
    return out


def utility_k(scores: list[float], p: float = PATIENCE) -> float:
    """Patience-weighted mean of scores (k,): (1 - p) / (1 - p^k) * sum_i p^(i-1) * scores[i-1]."""
    k = len(scores)
    if k == 0:
        raise ValueError("utility of zero generations")
    if not 0.0 < p < 1.0:
        raise ValueError(f"patience p must be in (0, 1), got {p}")
    return (1.0 - p) / (1.0 - p**k) * sum(p**i * u for i, u in enumerate(scores))


def distinct_k(classes: list[int]) -> int:
    """Number of equivalence classes among the k generations."""
    return len(set(classes))


def first_of_class(classes: list[int]) -> list[int]:
    """Indices of the generations that open a new class, in order."""
    seen: set[int] = set()
    out = []
    for i, c in enumerate(classes):
        if c not in seen:
            seen.add(c)
            out.append(i)
    return out


def metric_key(text: str) -> str:
    """A category as an MLflow-safe metric name part: "Character & Entity Naming" -> character_entity_naming."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "none"


def summarize_records(records: list[dict]) -> dict[str, float]:
    """Mean distinct (and utility, when rated) overall and per category."""
    out: dict[str, float] = {}
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[""].append(r)
        if r.get("category"):
            groups[metric_key(r["category"])].append(r)
    for cat, rs in groups.items():
        suffix = f"/{cat}" if cat else ""
        out[f"distinct{suffix}"] = sum(r["distinct"] for r in rs) / len(rs)
        rated = [r["utility"] for r in rs if r.get("utility") is not None]
        if rated:
            out[f"utility{suffix}"] = sum(rated) / len(rated)
        if not cat:
            out["n"] = float(len(rs))
    return out


# ---- components built from config -----------------------------------------------------------------


def parse_component(text: str | None, what: str) -> dict | None:
    """`--judge`/`--quality`: a JSON object with `_target_`, or just a dotted class path."""
    if text is None or text.strip().lower() in ("", "none"):
        return None
    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EvalError(
                f"--{what}: not valid JSON ({exc.msg}); give a {{'_target_': ...}} object"
            ) from None
    else:
        spec = {"_target_": text}
    if not isinstance(spec, dict) or "_target_" not in spec:
        raise EvalError(f"--{what}: expected a JSON object with '_target_' (a class path), got {text!r}")
    return spec


def instantiate_component(spec: dict, what: str):
    """Build a judge/scorer from its `_target_` dict; a bad target or argument is a one-line error."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(spec)
    except InstantiationException as exc:
        cause = exc.__cause__
        text = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        raise EvalError(f"--{what} {spec['_target_']}: {lines[0] if lines else exc}") from None


class NoveltySuite:
    """The NoveltyBench suite (see module docstring)."""

    name = "novelty"
    record_schema = {
        "category": "str|null",
        "generations": "list[str]",
        "classes": "list[number]",
        "distinct": "number",
        "utility": "number|null",
    }

    def __init__(self) -> None:
        self._built: dict[str, object] = {}

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("novelty")
        g.add_argument(
            "--data",
            required=True,
            help="NoveltyBench JSONL (curated.jsonl or wildchat-1k.jsonl), or builtin:arithmetic / "
            "builtin:open_prompts: the embedded held-out (test split) prompts, 200 of them",
        )
        g.add_argument("--k", type=int, default=10, help="samples per prompt (default: %(default)s)")
        g.add_argument("--temperature", type=float, default=1.0)
        g.add_argument("--max-tokens", type=int, default=512)
        g.add_argument("--patience", type=float, default=PATIENCE, help="p of utility_k (default: 0.8)")
        g.add_argument(
            "--judge",
            default=json.dumps(DEFAULT_JUDGE),
            help="equivalence judge: JSON {_target_: train.diversity.judges.X, ...} or a class path",
        )
        g.add_argument(
            "--quality",
            default=None,
            help="quality scorer: JSON {_target_: train.rewards.scorers.X, ...}; omit for distinct only",
        )
        g.add_argument(
            "--quality-scale",
            choices=("auto", "thresholds", "rating"),
            default="auto",
            help="thresholds: reward-model score -> bisect rating; rating: the scorer's own 1-10; "
            "auto: rating if the scorer has max_score (LLM judge), else thresholds",
        )

    def load_items(self, args: argparse.Namespace) -> list[dict]:
        from data_prep.chat_jsonl import load_chat_jsonl
        from data_prep.datasets import BUILTIN_PREFIX, load_prompt_rows
        from data_prep.schema import extra_info_of

        parse_component(args.judge, "judge")  # fail before any generation
        parse_component(args.quality, "quality")
        items = []
        if args.data.startswith(BUILTIN_PREFIX):  # the training task's held-out prompts (seed 0)
            rows = load_prompt_rows(args.data, BUILTIN_EVAL_SIZE, seed=0, split="test")
        else:
            rows = load_chat_jsonl(args.data, source="novelty")
        for row in rows:
            info = extra_info_of(row)
            items.append({"id": str(info["id"]), "category": info.get("category"), "prompt": row["prompt"]})
        return items

    def _component(self, text: str, what: str):
        if text not in self._built:
            self._built[text] = instantiate_component(parse_component(text, what), what)
        return self._built[text]

    def _ratings(self, scorer, scale: str, prompts: list[list[dict]], responses: list[str]) -> list[dict]:
        if not responses:
            return []
        raw = scorer.score(prompts, responses)
        if scale == "auto":
            scale = "rating" if hasattr(scorer, "max_score") else "thresholds"
        if scale == "thresholds":
            return [{"reward": float(r), "rating": rating_from_reward(float(r))} for r in raw]
        return [{"reward": float(r), "rating": min(10.0, max(1.0, float(r)))} for r in raw]

    def run_batch(self, items: list[dict], ctx: EvalContext) -> list[dict]:
        from train.diversity.partition import partition_groups

        args = ctx.args
        sampling = Sampling(
            n=args.k, temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed
        )
        judge = self._component(args.judge, "judge")  # built before generating: a bad spec fails fast
        scorer = self._component(args.quality, "quality") if args.quality is not None else None
        groups = ctx.generate([it["prompt"] for it in items], sampling)
        classes = partition_groups(groups, judge, mode="greedy")
        openers = [first_of_class(c) for c in classes]
        rated: list[dict] = []
        if scorer is not None:
            prompts = [it["prompt"] for it, idx in zip(items, openers) for _ in idx]
            responses = [g[i] for g, idx in zip(groups, openers) for i in idx]
            rated = self._ratings(scorer, args.quality_scale, prompts, responses)
        records, pos = [], 0
        for it, gens, cls, idx in zip(items, groups, classes, openers):
            record = {
                "id": it["id"],
                "category": it["category"],
                "prompt": it["prompt"][-1]["content"],
                "generations": gens,
                "classes": cls,
                "distinct": distinct_k(cls),
                "utility": None,
            }
            if rated:
                mine = dict(zip(idx, rated[pos : pos + len(idx)]))
                pos += len(idx)
                ratings = [mine[i]["rating"] if i in mine else None for i in range(len(cls))]
                record["rewards"] = [mine[i]["reward"] if i in mine else None for i in range(len(cls))]
                record["ratings"] = ratings
                record["scores"] = novelty_scores(cls, ratings)
                record["utility"] = utility_k(record["scores"], args.patience)
            records.append(record)
        return records

    def summarize(self, records: list[dict], args: argparse.Namespace) -> dict[str, float]:
        return summarize_records(records)


SUITE = NoveltySuite()

if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    main(SUITE)
