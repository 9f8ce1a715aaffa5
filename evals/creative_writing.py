"""evals.creative_writing: EQ-Bench Creative Writing v3 protocol on any checkpoint, with an LLM judge.

    python -m evals.creative_writing --ckpt RUN_ID --judge-model openai/gpt-4o-mini
    python -m evals.creative_writing --ckpt latest --judge-model anthropic/claude-sonnet-4-5 \
        --baseline-ckpt outputs/grpo_math/.../step_000000      # + pairwise against that checkpoint

Per item (prompt x iteration; iteration i uses seed modifier (i-1) mod len): generate at T 0.7, min_p
0.1 (a piece under --min-chars is regenerated up to --short-retries times, then marked failed and left
out); store the piece in `pieces.jsonl` BEFORE judging; the judge (temperature 0) scores it on the
rubric; the text metrics are computed. Summary: `score` 0-100 with a 95% bootstrap CI over pieces
(upstream; `--ci-over prompts` for prompts), failure counts, slop/repetition/complexity, and with
`--baseline-ckpt` the pairwise win rate. Upstream's rules are the default; the project's own rules are
options (docs/evals.md).

A judge that fails (after LLMClient's retries) stops the run with a one-line error; every generated
piece is already on disk and every judge reply already received is in the LLMClient cache, so
rerunning the same command regenerates nothing and asks the judge only for what is missing. A judge
reply from which no score is read is recorded as `judge_parse_failed` (counted, not scored).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evals.common.cli import EvalError, main
from evals.common.generation import Sampling
from evals.common.results import KeyedJsonl
from evals.common.suite import EvalContext
from evals.creative import pairwise as pw
from evals.creative import text_metrics as tm
from evals.creative.judge import judge_client
from evals.creative.prompts import expand_items, load_prompts
from evals.creative.rating import best_iteration_per_prompt
from evals.creative.rubric import Rubric, judge_prompt, load_rubric, pairwise_prompt
from evals.creative.scoring import (
    benchmark_score,
    bootstrap_ci,
    parse_scores,
    parse_scores_upstream,
    piece_score,
)

PIECES_FILE = "pieces.jsonl"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def load_baseline_pieces(spec: str, results_dir: Path) -> dict[str, dict]:
    """{item id: record} of the baseline: a samples.jsonl/pieces.jsonl file, a results folder holding
    one, or a checkpoint spec (folder, run id, ...) whose creative_writing results are in results_dir."""
    path = Path(spec).expanduser()
    candidates: list[Path] = []
    if path.is_file() and path.suffix == ".jsonl":
        candidates = [path]
    elif path.is_dir() and ((path / "samples.jsonl").is_file() or (path / PIECES_FILE).is_file()):
        candidates = [path / "samples.jsonl", path / PIECES_FILE]
    else:
        from evals.common.checkpoints import CheckpointNotFound, resolve

        try:
            refs = resolve(spec)
        except CheckpointNotFound as exc:
            raise EvalError(f"--baseline-ckpt: {exc}") from None
        if len(refs) != 1:
            raise EvalError(f"--baseline-ckpt {spec!r} names {len(refs)} checkpoints; give exactly one")
        folder = Path(results_dir) / refs[0].name / "creative_writing"
        candidates = [folder / "samples.jsonl", folder / PIECES_FILE]
    pieces: dict[str, dict] = {}
    for c in candidates:
        if c.is_file():
            for row in KeyedJsonl(c, "id").rows.values():
                if row.get("piece"):
                    pieces.setdefault(str(row["id"]), row)
    if not pieces:
        raise EvalError(
            f"baseline {spec!r} has no creative_writing pieces (looked in {', '.join(map(str, candidates))}): "
            f"run `python -m evals.creative_writing --ckpt {spec}` with the same --prompts/--iterations first"
        )
    return pieces


def _add_protocol_args(g) -> None:
    """Upstream's options: prompts, generation, the judge, slop lists, the bootstrap."""
    g.add_argument("--prompts", default=None, help="prompts JSON (default: the project's own 8 prompts)")
    g.add_argument("--iterations", type=int, default=3, help="pieces per prompt, each with its seed modifier")
    g.add_argument("--criteria", default=None, help="rubric criteria file, one per line")
    g.add_argument("--negative-criteria", default=None, help="lower-is-better criteria file")
    g.add_argument("--judge-prompt", default=None, help="judging prompt template")
    g.add_argument("--pairwise-prompt", default=None, help="pairwise prompt template")
    g.add_argument("--max-tokens", type=int, default=4000, help="generation budget per piece")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--min-p", type=float, default=0.1)
    g.add_argument("--min-chars", type=int, default=500, help="shorter pieces are regenerated")
    g.add_argument(
        "--short-retries", type=int, default=2, help="regenerations of a short piece (upstream: 3 tries)"
    )
    g.add_argument("--judge-model", default=None, help="provider/model, provider in {openai, anthropic}")
    g.add_argument("--judge-base-url", default=None, help="judge server URL (default: the provider's API)")
    g.add_argument("--judge-api-key-env", default=None, help="env var with the judge key")
    g.add_argument("--judge-max-tokens", type=int, default=1000, help="rubric judge reply budget")
    g.add_argument(
        "--pairwise-max-tokens", type=int, default=16000, help="pairwise judge reply budget (upstream)"
    )
    g.add_argument("--judge-timeout", type=float, default=120.0, help="seconds per judge request")
    g.add_argument("--judge-retries", type=int, default=5, help="retries on 429/5xx/time-outs")
    g.add_argument("--judge-concurrency", type=int, default=8)
    g.add_argument("--judge-cache-dir", default=None, help="judge reply cache (default: .cache/llm_replies)")
    g.add_argument("--baseline-ckpt", default=None, help="pairwise baseline: checkpoint or its results")
    g.add_argument("--pairwise-max-chars", type=int, default=4000, help="pieces are cut to this for pairwise")
    g.add_argument("--slop-words", default=None, help="slop word list (default: the project's own)")
    g.add_argument("--slop-bigrams", default=None)
    g.add_argument("--slop-trigrams", default=None)
    g.add_argument("--bootstrap-resamples", type=int, default=500)


# The project's own rules: switches (off = upstream) and choices (the first value is upstream's).
_RULE_SWITCHES = (
    (
        "--strict-scores",
        "read only rubric criteria from the [Scores] block (any markdown/numbering/apostrophes); "
        "upstream counts every 'Name: N' of the reply, e.g. 'Chapter 2: 15'",
    ),
    (
        "--judge-sees-seed",
        "show the judges the brief the writer saw; upstream shows the template with <SEED> in it",
    ),
    (
        "--per-piece-text-metrics",
        "slop and complexity as means of per-piece values; upstream computes them on all pieces joined",
    ),
)
_RULE_CHOICES = (
    (
        "--ci-over",
        ("pieces", "prompts"),
        "bootstrap unit of the score CI: pieces (upstream) or prompts (a prompt's pieces together)",
    ),
    (
        "--complexity-rules",
        ("upstream", "project"),
        "project: words = tokens with a letter, vowel-group syllables for unknown words, FK >= 0",
    ),
    (
        "--repetition-words",
        ("whitespace", "alphabetic"),
        "repetition denominator: whitespace words (upstream) or alphabetic tokens",
    ),
    (
        "--pairwise-parse",
        ("upstream", "exact"),
        "exact: count only values that are an id plus '+' signs, at most 5, no cross-penalty",
    ),
)


def _add_beyond_upstream_args(o) -> None:
    """The project's own rules, each off by default (docs/evals.md)."""
    for flag, help_text in _RULE_SWITCHES:
        o.add_argument(flag, action="store_true", help=help_text)
    for flag, choices, help_text in _RULE_CHOICES:
        o.add_argument(flag, choices=choices, default=choices[0], help=help_text)
    o.add_argument(
        "--repetition-min-prompts",
        type=int,
        default=3,
        help="an n-gram counts for repetition if it occurs in this many prompts' pieces (upstream: 3)",
    )
    o.add_argument(
        "--human-profile",
        default=None,
        help="EQ-Bench's human_writing_profile.json: rank repeated n-grams by over-use against it "
        "(upstream ships it; without it, by count, as upstream does when it is missing)",
    )
    o.add_argument(
        "--stopwords",
        default=None,
        help="stopword file, one per line (upstream: NLTK's English list; default: PyPI stop-words)",
    )


def _add_rating_args(r) -> None:
    """`--rate`: the pairwise ladder over every evaluated checkpoint."""
    r.add_argument(
        "--rate",
        action="store_true",
        help="rate every checkpoint with creative_writing results in --results-dir against the others "
        "(EQ-Bench v3's pairwise TrueSkill/Elo; needs --judge-model, no --ckpt)",
    )
    r.add_argument("--rate-budget", type=int, default=48, help="matchups per pair of checkpoints (upstream)")
    r.add_argument(
        "--rate-anchors",
        default=None,
        help="two checkpoints and the ratings they are mapped to, e.g. 'step_000000=200,step_000100=1500' "
        "(upstream anchors two API models; without two anchors the raw ratings stand)",
    )
    r.add_argument(
        "--rate-ignore-prompts",
        default=None,
        help="prompt ids left out of the rating (default: upstream's 5,16,20,21,26,28,30 for its v3 file)",
    )
    r.add_argument(
        "--rate-rank-window",
        type=int,
        default=16,
        help="drop matchups of checkpoints further apart on the ladder",
    )


class CreativeWritingSuite:
    name = "creative_writing"
    summary_options = (
        "rate",
        "rate_budget",
        "rate_anchors",
        "rate_ignore_prompts",
        "rate_rank_window",
        "ci_over",
        "per_piece_text_metrics",
        "repetition_min_prompts",
        "repetition_words",
        "human_profile",
        "stopwords",
        "bootstrap_resamples",
    )

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        _add_protocol_args(parser.add_argument_group("creative writing (EQ-Bench v3 protocol)"))
        _add_beyond_upstream_args(
            parser.add_argument_group(
                "creative writing options beyond upstream (off by default; docs/evals.md says what each changes)"
            )
        )
        _add_rating_args(parser.add_argument_group("rating (python -m evals.creative_writing --rate)"))

    # -- setup ---------------------------------------------------------------------------------------
    def _setup(self, args: argparse.Namespace) -> dict:
        """Rubric, slop lists, judge client and baseline pieces, loaded once per args (fails fast)."""
        cached = getattr(args, "_creative_setup", None)
        if cached is not None:
            return cached
        from infra.llm.client import LLMClientError

        if not args.judge_model:
            raise EvalError(
                "creative_writing needs a judge: pass --judge-model provider/model (e.g. openai/gpt-4o-mini; "
                "add --judge-base-url URL for a local OpenAI- or Anthropic-compatible server)"
            )
        try:
            setup = {
                "rubric": load_rubric(
                    args.criteria, args.negative_criteria, args.judge_prompt, args.pairwise_prompt
                ),
                "slop": tm.load_slop_lists(args.slop_words, args.slop_bigrams, args.slop_trigrams),
                "judge": judge_client(args),
            }
        except (ValueError, LLMClientError) as exc:  # CheckpointNotFound is a ValueError too
            raise EvalError(str(exc)) from None
        setup["baseline"] = (
            load_baseline_pieces(args.baseline_ckpt, args.results_dir) if args.baseline_ckpt else None
        )
        args._creative_setup = setup
        return setup

    def load_items(self, args: argparse.Namespace) -> list[dict]:
        try:
            items = expand_items(load_prompts(args.prompts), args.iterations)
            prompt_set = Path(args.prompts).name if args.prompts else "project"
            items = [dict(it, prompt_set=prompt_set) for it in items]
        except ValueError as exc:
            raise EvalError(str(exc)) from None
        self._setup(args)
        return items

    # -- one batch -----------------------------------------------------------------------------------
    def _generate(self, items: list[dict], ctx: EvalContext, store: KeyedJsonl) -> None:
        """Generate the pieces not in `store`, regenerating short ones; append them all to the store."""
        args = ctx.args
        todo = [it for it in items if it["id"] not in store.rows]
        attempts = {it["id"]: 0 for it in todo}
        last: dict[str, str] = {}
        for attempt in range(args.short_retries + 1):
            if not todo:
                break
            sampling = Sampling(
                n=1,
                temperature=args.temperature,
                min_p=args.min_p,
                max_tokens=args.max_tokens,
                seed=args.seed + 7919 * attempt,  # a retry is a new sample, not the same short one
            )
            outs = ctx.generate([[{"role": "user", "content": it["brief"]}] for it in todo], sampling)
            short = []
            for it, out in zip(todo, outs):
                attempts[it["id"]] += 1
                last[it["id"]] = out[0]
                if len(out[0].strip()) < args.min_chars:
                    short.append(it)
            todo = short
        rows = []
        briefs = {it["id"]: it["brief"] for it in items}
        for it_id, n in attempts.items():
            text = last[it_id]
            ok = len(text.strip()) >= args.min_chars
            rows.append(
                {
                    "id": it_id,
                    "brief": briefs[it_id],
                    "piece": text.strip() if ok else None,  # stored stripped, as upstream
                    "attempts": n,
                    "last_output": text,
                }
            )
        if rows:
            store.add(rows)

    def run_batch(self, items: list[dict], ctx: EvalContext) -> list[dict]:
        from infra.llm.client import LLMClientError

        args = ctx.args
        setup = self._setup(args)
        rubric: Rubric = setup["rubric"]
        store = KeyedJsonl(
            Path(ctx.results_dir) / PIECES_FILE, "id"
        )  # each piece, written before it is judged
        self._generate(items, ctx, store)

        baseline = setup["baseline"] or {}
        requests: list[tuple[str, str, str]] = []  # (item id, kind, prompt)
        for it in items:
            piece = store.rows[it["id"]]["piece"]
            if piece is None:
                continue
            shown = judge_brief(it, args)
            requests.append((it["id"], "rubric", judge_prompt(rubric, shown, piece)))
            base = baseline.get(it["id"])
            if base is not None and base.get("brief", it["brief"]) == it["brief"]:
                a, b = piece[: args.pairwise_max_chars], base["piece"][: args.pairwise_max_chars]
                requests.append((it["id"], "test_first", pairwise_prompt(rubric, shown, a, b)))
                requests.append((it["id"], "baseline_first", pairwise_prompt(rubric, shown, b, a)))
        try:
            judge = setup["judge"]
            replies: list[str] = [""] * len(requests)
            for kind_is_rubric in (True, False):
                idx = [k for k, r in enumerate(requests) if (r[1] == "rubric") == kind_is_rubric]
                if not idx:
                    continue
                got = judge.complete_many(
                    [[{"role": "user", "content": requests[k][2]}] for k in idx],
                    temperature=0.0,
                    max_tokens=args.judge_max_tokens if kind_is_rubric else args.pairwise_max_tokens,
                    max_concurrency=args.judge_concurrency,
                )
                for k, reply in zip(idx, got):
                    replies[k] = reply
        except LLMClientError as exc:
            raise EvalError(
                f"judge {args.judge_model}: {exc}. The generated pieces are kept in {store.path}; "
                "rerun the same command to judge the rest"
            ) from None
        by_item: dict[str, dict[str, str]] = {}
        for (item_id, kind, _), reply in zip(requests, replies):
            by_item.setdefault(item_id, {})[kind] = reply
        return [
            self._record(it, store.rows[it["id"]], by_item.get(it["id"], {}), setup, args) for it in items
        ]

    def _record(
        self, item: dict, gen: dict, replies: dict[str, str], setup: dict, args: argparse.Namespace
    ) -> dict:
        rubric: Rubric = setup["rubric"]
        record = {**item, "piece": gen["piece"], "generation_attempts": gen["attempts"]}
        if gen["piece"] is None:
            record.update(status="generation_failed", last_output=gen["last_output"])
            return record
        piece = gen["piece"]
        cx = tm.complexity(piece, args.complexity_rules)
        record.update(
            length_chars=len(piece),
            slop_index=tm.slop_index(piece, setup["slop"]),
            complexity=cx.index,
            fk_grade=cx.fk_grade,
            judge_reply=replies["rubric"],
        )
        if args.strict_scores:
            scores = parse_scores(replies["rubric"], rubric.criteria)
        else:
            scores = parse_scores_upstream(replies["rubric"])
        score = piece_score(scores, rubric.negative)
        if score is not None:
            record.update(status="ok", scores=scores, n_criteria=len(scores), piece_score=score)
        else:
            record.update(status="judge_parse_failed")
        if "test_first" in replies:
            parse = pw.parse_verdict if args.pairwise_parse == "exact" else pw.parse_verdict_upstream
            first, second = parse(replies["test_first"]), parse(replies["baseline_first"])
            record["pairwise_replies"] = [replies["test_first"], replies["baseline_first"]]
            if first is None or second is None:
                record["pairwise"] = {"status": "parse_failed"}
            else:
                res = pw.combine_orders(first, second)
                record["pairwise"] = {
                    "status": "ok",
                    "test_plus": res.test_plus,
                    "baseline_plus": res.baseline_plus,
                    "outcome": res.outcome,
                    "fraction": res.fraction,
                    "plus_share": res.plus_share,
                }
        return record

    # -- summary -------------------------------------------------------------------------------------
    def summarize(self, records: list[dict], args: argparse.Namespace) -> dict[str, float]:
        generated = [r for r in records if r.get("piece")]
        scored = [r for r in records if r.get("status") == "ok"]
        by_prompt = args.ci_over == "prompts"
        score, lo, hi = benchmark_score(
            [r["piece_score"] for r in scored],
            [r["prompt_id"] for r in scored] if by_prompt else None,
            resamples=args.bootstrap_resamples,
            seed=args.seed,
        )
        metrics: dict[str, float] = {
            "score": score,
            "score_ci_lo": lo,
            "score_ci_hi": hi,
            "n_items": float(len(records)),
            "n_scored": float(len(scored)),
            "n_generation_failed": float(sum(r.get("status") == "generation_failed" for r in records)),
            "n_judge_parse_failed": float(sum(r.get("status") == "judge_parse_failed" for r in records)),
            "mean_chars": _mean([r["length_chars"] for r in generated]),
        }
        metrics.update(
            text_metrics([r["piece"] for r in generated], [r["prompt_id"] for r in generated], args)
        )
        best = best_iteration_per_prompt(
            {(r["prompt_id"], str(r["iteration"])): r["piece_score"] for r in scored}
        )
        if best:
            chosen = [r["piece_score"] for r in scored if best.get(r["prompt_id"]) == str(r["iteration"])]
            metrics["score_best_iteration"] = 5 * _mean(chosen)
        pairs = [r for r in records if "pairwise" in r]
        if pairs:
            ok = [r for r in pairs if r["pairwise"]["status"] == "ok"]
            win, win_lo, win_hi = bootstrap_ci(
                [r["pairwise"]["outcome"] for r in ok],
                [r["prompt_id"] for r in ok] if by_prompt else None,
                resamples=args.bootstrap_resamples,
                seed=args.seed,
            )
            metrics.update(
                pairwise_win_rate=win,
                pairwise_win_rate_ci_lo=win_lo,
                pairwise_win_rate_ci_hi=win_hi,
                pairwise_fraction=_mean(
                    [r["pairwise"].get("fraction", r["pairwise"]["outcome"]) for r in ok]
                ),
                pairwise_plus_share=_mean([r["pairwise"]["plus_share"] for r in ok]),
                n_pairwise=float(len(ok)),
                n_pairwise_parse_failed=float(len(pairs) - len(ok)),
            )
        return metrics


def judge_brief(item: dict, args: argparse.Namespace) -> str:
    """What the judges are told the writing prompt was: the template with <SEED> (upstream), or with
    --judge-sees-seed the brief the writer saw."""
    if getattr(args, "judge_sees_seed", False):
        return item["brief"]
    return item.get("template", item["brief"])


def text_metrics(pieces: list[str], prompt_ids: list[str], args: argparse.Namespace) -> dict[str, float]:
    """slop_index, complexity (on all pieces joined by blank lines, upstream; or per-piece means with
    --per-piece-text-metrics) and repetition over the pieces."""
    if not pieces:
        return {"slop_index": float("nan"), "complexity": float("nan"), "repetition": float("nan")}
    slop = tm.load_slop_lists(args.slop_words, args.slop_bigrams, args.slop_trigrams)
    if args.per_piece_text_metrics:
        slop_value = _mean([tm.slop_index(p, slop) for p in pieces])
        cx_value = _mean([tm.complexity(p, args.complexity_rules).index for p in pieces])
    else:
        joined = "\n\n".join(pieces)
        slop_value = tm.slop_index(joined, slop)
        cx_value = tm.complexity(joined, args.complexity_rules).index
    return {
        "slop_index": slop_value,
        "complexity": cx_value,
        "repetition": tm.repetition_index(
            pieces,
            prompt_ids,
            min_prompts=args.repetition_min_prompts,
            words=args.repetition_words,
            human_profile=args.human_profile,
            stopwords=tm.english_stopwords(args.stopwords),
        ),
    }


SUITE = CreativeWritingSuite()


def rate(argv: list[str] | None = None):
    """`python -m evals.creative_writing --rate ...`: rate every checkpoint evaluated so far."""
    from evals.creative.rate_cmd import rate_main

    return rate_main(argv, SUITE, judge_brief)


if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    import sys

    if "--rate" in sys.argv[1:]:
        rate([a for a in sys.argv[1:] if a != "--rate"])
    else:
        main(SUITE)
