"""Math benchmarks: math500, gsm8k, aime24, amc23, minerva_math (Qwen2.5-Math evaluation conventions).

    python -m evals.math --ckpt latest --datasets math500 --n 4 --temperature 0.6

Data: `<data-dir>/<dataset>/test.jsonl`, read by the project's loaders (`data_prep.math_jsonl`, which
also builds the Qwen CoT chat prompt); `--data-dir` defaults to `$RLPOST_MATH_DATA`, else
`../shared/data/math` beside the checkout. Grading uses the training reward's grader
(`math_grader`). Metrics per dataset and over all items: `acc` (first sample),
`pass@k` (unbiased), `maj@k` (most common normalised answer among the first k, ties to the one seen
first, scored by that answer; a sample with no answer votes for "no answer", as upstream), plus `acc` by
subject and level where the data has them (MATH's `type` = math500's `subject`, minerva's `type`).
Options beyond upstream (off by default, docs/evals.md): `--maj-vote equivalence`,
`--maj-skip-unanswered`, `--rm-scorer JSON` (adds `rm@k`).

Format (CS336's format x answer reward, train/rewards/r1_zero_reward.py), over all samples: `format_rate`
(the response is in `--answer-format`: `boxed`, or `r1_zero`'s "</think> <answer> .. </answer>"),
`answer_rate` (answer right whatever the format) and the four shares `fmt_{wrong,right}_ans_{wrong,right}`.
`--tools calculator[,python,...]` answers with tools over several turns through the training rollout's agent
loop (the same tool and environment code: train/env/), in the environment the checkpoint was trained in (its
run's `env.*`, `--tools` replacing the tools: evals/common/agent_env.py); each record keeps its turns, and
the summary adds `tool_call_rate` (samples that called a tool), `turns_mean`, `tool_calls_mean` and
`tool_error_rate`.
`--datasets builtin:tool_math` (or any `builtin:` prompt set with golds) scores the project's own
generated test split (`--builtin-size` rows) instead of files.
`--prompt-template r1_zero` prompts with the course's plain-text R1-Zero prompt instead of the chat prompt
(local checkpoints only); its answer format is then r1_zero unless `--answer-format` says otherwise.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

from data_prep.math_jsonl import SOURCES, load_math_jsonl
from data_prep.prompt_templates import TEMPLATES, render
from data_prep.schema import DatasetError, extra_info_of
from evals.common.agent_env import agent_env
from evals.common.cli import main
from evals.common.generation import Sampling
from evals.common.metrics import best_of_k_index, group_by_equivalence, majority_index, mean_ci
from evals.common.suite import EvalContext
from infra.models import PROJECT_ROOT
from math_grader import ANSWER_RULES, extract_answer, grade_batch, normalize_answer, start_workers
from math_grader.answer_format import FORMATS, class_rates, formatted_answer
from math_grader.pass_at_k import pass_at_k

DATASETS = ("math500", "gsm8k", "aime24", "amc23", "minerva_math")


def default_data_dir() -> Path:
    return Path(os.environ.get("RLPOST_MATH_DATA") or PROJECT_ROOT.parent / "shared" / "data" / "math")


def _ks(n: int, asked: list[int] | None) -> list[int]:
    """The k values reported: the asked ones that fit in n, else powers of two up to n, and n itself."""
    if asked:
        return sorted({k for k in asked if 1 <= k <= n})
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def vote_keys(answers: list[str | None], by: str = "string") -> list:
    """What each sample votes for in maj@k: its normalised answer (`by="string"`, Qwen2.5-Math's
    `rm_maj_eval` default), or its group under the grader's equivalence (`by="equivalence"`, Qwen's
    `use_symbol=True`). A sample without an answer gets the key None (see `majority_index`)."""
    if by == "equivalence":
        from math_grader import is_equiv

        groups = group_by_equivalence(answers, is_equiv)
        return [None if a is None else g for a, g in zip(answers, groups)]
    if by != "string":
        raise ValueError(f"maj@k vote must be 'string' or 'equivalence', got {by!r}")
    return [normalize_answer(a) if a else None for a in answers]


def item_metrics(
    correct: list[float],
    answers: list[str | None],
    ks: list[int],
    *,
    vote: str = "string",
    skip_unanswered: bool = False,
    rm_scores: list[float] | None = None,
) -> dict[str, float]:
    """acc, pass@k and maj@k (and rm@k with `rm_scores`) of one item's samples (in generation order).

    maj@k: the most common vote among the first k (ties: the vote seen first), scored by its first
    sample; an unanswered sample votes for "no answer" unless `skip_unanswered` (see `majority_index`).
    rm@k: the correctness of the first k samples' highest-scored one (Qwen2.5-Math's `rm@k`).
    """
    n, c = len(correct), int(sum(correct))
    out = {"acc": float(correct[0])}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, c, k)
        keys = vote_keys(answers[:k], vote)
        best = majority_index(keys, skip_unanswered=skip_unanswered)
        out[f"maj@{k}"] = float(correct[best]) if best is not None else 0.0
        if rm_scores is not None:
            out[f"rm@{k}"] = float(correct[best_of_k_index(rm_scores[:k])])
    return out


def _add_data_and_sampling_args(g) -> None:
    """Which problems, how many samples, how answers are read and generated."""
    g.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder with <dataset>/test.jsonl (default $RLPOST_MATH_DATA, else ../shared/data/math)",
    )
    g.add_argument("--datasets", default=",".join(DATASETS), help=f"comma list of {', '.join(DATASETS)}")
    g.add_argument("--n", type=int, default=1, help="samples per problem")
    g.add_argument("--k", default=None, help="comma list of k for pass@k/maj@k (default 1,2,4,..,n)")
    g.add_argument(
        "--answer-rule",
        choices=ANSWER_RULES,
        default="qwen",
        help="which answer a response gives: 'qwen' (default, upstream) Qwen2.5-Math's order of rules "
        "('final answer is $..$. I hope' over any box); option 'last': the last committed answer, as the "
        "training reward reads it (a correction replaces an earlier answer)",
    )
    g.add_argument(
        "--tools", default=None,
        help="comma list of tools (calculator, python, catalog, or a _target_; none: no tools) as env.tools: "
        "multi-turn answers in the checkpoint's training env (its env.* keys, these tools)",
    )  # fmt: skip
    g.add_argument(
        "--max-turns", type=int, default=None,
        help="with --tools: model turns per answer (default: the training run's env.max_turns, else 4)",
    )  # fmt: skip
    g.add_argument("--builtin-size", type=int, default=200, help="rows of a builtin: dataset's test split")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=2048)


def _add_scoring_args(g) -> None:
    """How samples are voted on and scored: maj@k, the prompt/answer format, rm@k."""
    g.add_argument(
        "--maj-vote",
        choices=("string", "equivalence"),
        default="string",
        help="maj@k votes grouped by normalised answer string (Qwen2.5-Math default) or, option, by "
        "the grader's equivalence (Qwen's use_symbol: '1/2' and '\\frac{1}{2}' vote together)",
    )
    g.add_argument(
        "--maj-skip-unanswered",
        action="store_true",
        help="option: samples with no extracted answer cast no maj@k vote (upstream: 'no answer' is a "
        "vote, as Qwen's '' and lm-eval's '[invalid]')",
    )
    g.add_argument(
        "--prompt-template",
        choices=sorted(TEMPLATES),
        default=None,
        help="plain-text prompt (CS336: r1_zero) instead of the chat prompt; local checkpoints only",
    )
    g.add_argument(
        "--answer-format",
        choices=FORMATS,
        default=None,
        help="the format format_rate measures (default: r1_zero with --prompt-template r1_zero, else boxed)",
    )
    g.add_argument(
        "--rm-scorer",
        default=None,
        help="option: rm@k = correctness of the best of the first k samples by this scorer, a JSON "
        "{_target_: train.rewards.scorers.X, ...} (e.g. RewardModelScorer with model_path)",
    )


class MathSuite:
    name = "math"
    summary_options = ("k", "maj_vote", "maj_skip_unanswered")
    record_schema = {
        "dataset": "str",
        "responses": "list+[str]",
        "answers": "list+[str|null]",
        "correct": "list+[number]",
        "rm_scores": "list[number]?",
        "subject": "str?",
        "level": "str?",
    }

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("math")
        _add_data_and_sampling_args(g)
        _add_scoring_args(g)

    def load_items(self, args: argparse.Namespace) -> list[dict]:
        if getattr(args, "tools", None):  # a bad --tools fails here, before any engine starts
            agent_env(args.tools, getattr(args, "max_turns", None))
        data_dir = Path(args.data_dir or default_data_dir())
        names = [d.strip() for d in args.datasets.split(",") if d.strip()]
        unknown = [d for d in names if d not in SOURCES and not d.startswith("builtin:")]
        if unknown:
            raise DatasetError(f"unknown math dataset(s) {unknown}; choose from {', '.join(DATASETS)}")
        items = []
        for name in names:
            if name.startswith("builtin:"):
                items += _builtin_items(name, args)
                continue
            path = data_dir / name / "test.jsonl"
            if not path.is_file():
                raise DatasetError(f"math data file not found: {path} (set --data-dir or $RLPOST_MATH_DATA)")
            for row in load_math_jsonl(path, name):
                info = extra_info_of(row)
                template = getattr(args, "prompt_template", None)
                prompt = render(template, row) if template else row["prompt"]
                item = {"id": f"{name}/{info['id']}", "dataset": name, "prompt": prompt}
                item["gold"] = row["ground_truth"]
                for key in ("subject", "level"):
                    if info.get(key) is not None:
                        item[key] = str(info[key])
                items.append(item)
        return items

    def run_batch(self, items: list[dict], ctx: EvalContext) -> list[dict]:
        a = ctx.args
        sampling = Sampling(
            n=a.n, temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens, seed=a.seed
        )
        start_workers()  # the grader's workers start while the responses are generated
        episodes = None
        if getattr(a, "tools", None):
            env = agent_env(a.tools, getattr(a, "max_turns", None), getattr(ctx.checkpoint, "path", None))
            outs = ctx.generator.generate_trajectories(
                [it["prompt"] for it in items],
                sampling,
                env,
                [it.get("row") or {"prompt": it["prompt"], "ground_truth": it["gold"]} for it in items],
            )
            responses = [[o["text"] for o in os_] for os_ in outs]
            episodes = [[o["episode"] for o in os_] for os_ in outs]
        else:
            responses = ctx.generate([it["prompt"] for it in items], sampling)
        flat = [r for rs in responses for r in rs]
        golds = [it["gold"] for it, rs in zip(items, responses) for _ in rs]
        rule = getattr(a, "answer_rule", "qwen")
        scores = grade_batch(flat, golds, rule=rule)
        records, pos = [], 0
        for item, rs in zip(items, responses):
            correct = scores[pos : pos + len(rs)]
            pos += len(rs)
            record = {k: v for k, v in item.items() if k not in ("prompt", "row")}
            answers = [extract_answer(r, rule) for r in rs]
            record |= {"responses": rs, "answers": answers, "correct": correct}
            record["format"] = [float(formatted_answer(r, answer_format(a))[0]) for r in rs]
            if episodes is not None:  # each sample's tool use (the samples viewer shows the turns)
                eps = episodes[len(records)]
                record["turns"] = [e["turns"] for e in eps]
                record["tool_calls"] = [e["tool_calls"] for e in eps]
                record["tool_errors"] = [sum(e["errors"].values()) for e in eps]
                record["trajectories"] = [
                    [{"role": s["role"], "text": s["text"]} for s in e["segments"]] for e in eps
                ]
            records.append(record)
        if getattr(a, "rm_scorer", None):
            scorer = self._scorer(a.rm_scorer)
            prompts = [it["prompt"] for it, rs in zip(items, responses) for _ in rs]
            scores, pos = scorer.score(prompts, flat), 0
            for record in records:
                k = len(record["responses"])
                record["rm_scores"] = [float(x) for x in scores[pos : pos + k]]
                pos += k
        return records

    def _scorer(self, spec: str):
        """The --rm-scorer component, built once per spec."""
        from evals.novelty import instantiate_component, parse_component

        built = self.__dict__.setdefault("_scorers", {})
        if spec not in built:
            built[spec] = instantiate_component(parse_component(spec, "rm-scorer"), "rm-scorer")
        return built[spec]

    def summarize(self, records: list[dict], args: argparse.Namespace) -> dict[str, float]:
        if not records:
            return {}
        n = min(len(r["correct"]) for r in records)
        ks = _ks(n, [int(k) for k in args.k.split(",")] if getattr(args, "k", None) else None)
        with_rm = all("rm_scores" in r for r in records)
        per_item = [
            item_metrics(
                r["correct"][:n],
                r["answers"][:n],
                ks,
                vote=getattr(args, "maj_vote", "string"),
                skip_unanswered=getattr(args, "maj_skip_unanswered", False),
                rm_scores=r["rm_scores"][:n] if with_rm else None,
            )
            for r in records
        ]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(records):
            groups[""].append(i)
            groups[f"{r['dataset']}/"].append(i)
            for key in ("subject", "level"):
                if key in r:
                    groups[f"{r['dataset']}/{key}/{r[key]}/"].append(i)
        out: dict[str, float] = {}
        if all("tool_calls" in r for r in records):  # --tools: how the answers used them
            calls = [c for r in records for c in r["tool_calls"][:n]]
            errors = sum(e for r in records for e in r["tool_errors"][:n])
            out["tool_call_rate"] = sum(c > 0 for c in calls) / len(calls)
            out["tool_calls_mean"] = sum(calls) / len(calls)
            out["turns_mean"] = sum(t for r in records for t in r["turns"][:n]) / len(calls)
            out["tool_error_rate"] = errors / max(sum(calls), 1)
        if all("format" in r for r in records):  # every sample's format x answer class
            for prefix, idx in groups.items():
                if prefix.count("/") <= 1:
                    fmt = [bool(f) for i in idx for f in records[i]["format"][:n]]
                    right = [c == 1.0 for i in idx for c in records[i]["correct"][:n]]
                    out |= {f"{prefix}{k}": v for k, v in class_rates(fmt, right).items()}
        for prefix, idx in groups.items():
            names = list(per_item[0]) if prefix.count("/") <= 1 else ["acc"]
            for m in names:
                vals = [per_item[i][m] for i in idx]
                if m == "acc" and prefix.count("/") <= 1:
                    mean, lo, hi = mean_ci(vals, seed=args.seed)
                    out |= {f"{prefix}acc": mean, f"{prefix}acc_ci_lo": lo, f"{prefix}acc_ci_hi": hi}
                else:
                    out[f"{prefix}{m}"] = sum(vals) / len(vals)
            out[f"{prefix}n"] = float(len(idx))
        return out


def _builtin_items(name: str, args: argparse.Namespace) -> list[dict]:
    """The test split of a project-generated prompt set (data_prep/datasets.py), as eval items."""
    from data_prep.datasets import load_prompt_rows

    rows = load_prompt_rows(name, args.builtin_size, args.seed, split="test")
    label = name.removeprefix("builtin:")
    return [
        {"id": f"{label}/{i}", "dataset": label, "prompt": r["prompt"], "gold": r["ground_truth"], "row": r}
        for i, r in enumerate(rows)
        if r.get("ground_truth")
    ]


def answer_format(args: argparse.Namespace) -> str:
    """--answer-format, else r1_zero under the r1_zero prompt, else boxed (the chat prompt asks for a box)."""
    if getattr(args, "answer_format", None):
        return args.answer_format
    return "r1_zero" if getattr(args, "prompt_template", None) == "r1_zero" else "boxed"


SUITE = MathSuite()

if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    main(SUITE)
