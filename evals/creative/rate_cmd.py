"""`python -m evals.creative_writing --rate`: rate every checkpoint whose creative_writing results are in
--results-dir against the others (EQ-Bench v3's pairwise Elo/TrueSkill, evals/creative/rating.py).

Judge replies are kept in `<results-dir>/creative_writing_rating/judgements.jsonl` (one line per reply, keyed
by both pieces' checkpoints, iterations, prompt and the prompt text's hash), so a rerun after more
checkpoints were evaluated judges only the new matchups. Writes `ratings.json` there and logs
`eval/creative_writing/rating` (with `_ci_lo`/`_ci_hi`, `rating_norm`, `rating_matchups`) on each
checkpoint's training run at its step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from evals.common.cli import DEFAULT_RESULTS_DIR, EvalError
from evals.common.results import KeyedJsonl, ResultsStore
from evals.creative import pairwise as pw
from evals.creative import rating as rt
from evals.creative.judge import judge_client
from evals.creative.rubric import load_rubric, pairwise_prompt

RATING_DIR = "creative_writing_rating"
SUITE_NAME = "creative_writing"
UPSTREAM_PROMPT_FILE = "creative_writing_prompts_v3.json"


def build_rate_parser(suite) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evals.creative_writing --rate",
        description="pairwise rating of every checkpoint with creative_writing results",
    )
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--no-mlflow", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    suite.add_args(parser)
    return parser


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_writers(results_dir: Path) -> dict[str, dict]:
    """{checkpoint name: {"summary": summary.json, "records": scored records}} for every checkpoint with
    creative_writing results."""
    writers = {}
    for summary_path in sorted(Path(results_dir).glob(f"*/{SUITE_NAME}/summary.json")):
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            print(f"[rate] skipped {summary_path}: not valid JSON (rerun that checkpoint's eval)")
            continue
        name = summary_path.parent.parent.name
        records = ResultsStore(results_dir, name, SUITE_NAME).records()
        scored = [r for r in records if r.get("status") == "ok" and r.get("piece")]
        if scored:
            writers[name] = {"summary": summary, "records": scored}
    return writers


def iteration_scores(records: list[dict], negative: set[str]) -> dict[str, float]:
    """{iteration: mean of every (inverted) judge score of its pieces}, rounded to 2 decimals (upstream)."""
    acc: dict[str, list[float]] = {}
    for r in sorted(records, key=lambda r: int(r["iteration"])):
        vals = [20.0 - v if k in negative else v for k, v in r["scores"].items()]
        acc.setdefault(str(r["iteration"]), []).extend(vals)
    return {i: round(sum(v) / len(v), 2) for i, v in acc.items() if v}


def rate_main(argv: list[str] | None, suite, judge_brief) -> dict[str, rt.WriterRating]:
    """`suite` and `judge_brief` come from evals.creative_writing (the suite layer imports this, not the reverse)."""
    args = build_rate_parser(suite).parse_args(argv)
    try:
        return run_rating(args, judge_brief)
    except (EvalError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None


def run_rating(args: argparse.Namespace, judge_brief) -> dict[str, rt.WriterRating]:
    writers = load_writers(args.results_dir)
    if len(writers) < 2:
        raise EvalError(
            f"--rate needs creative_writing results of at least 2 checkpoints in {args.results_dir} "
            f"(found {len(writers)}): run `python -m evals.creative_writing --ckpt C --judge-model M` first"
        )
    if not args.judge_model:
        raise EvalError("--rate needs a pairwise judge: pass --judge-model provider/model")
    rubric = load_rubric(args.criteria, args.negative_criteria, args.judge_prompt, args.pairwise_prompt)
    anchors = _parse_anchors(args.rate_anchors)
    names = sorted(writers)
    ignored = _ignored_prompts(args.rate_ignore_prompts, writers)
    wanted = _wanted_matchups(args, writers, rubric, ignored, judge_brief)
    store = KeyedJsonl(
        Path(args.results_dir) / RATING_DIR / "judgements.jsonl", "key"
    )  # every pairwise reply
    _judge_missing(args, [w for w in wanted if w["key"] not in store.rows], store)
    judgements, n_failed = _read_verdicts(args, wanted, store)
    ratings = rt.rate(names, judgements, anchors, ignored, args.rate_rank_window)
    out = {
        "writers": {n: asdict(r) for n, r in ratings.items()},
        "n_judgements": len(judgements),
        "n_parse_failed": n_failed,
        "anchors": anchors,
        "ignored_prompts": sorted(ignored),
    }
    path = Path(args.results_dir) / RATING_DIR / "ratings.json"
    path.write_text(json.dumps(out, indent=1))
    for n in sorted(names, key=lambda n: -ratings[n].rating):
        r = ratings[n]
        print(
            f"[rate] {n}: rating {r.rating:.1f} [{r.ci_lo:.1f}, {r.ci_hi:.1f}] norm {r.rating_norm:.1f} ({r.n_matchups} matchups)"
        )
    print(f"[rate] {len(judgements)} judgements ({n_failed} unparsable) -> {path}")
    if not args.no_mlflow:
        _log(writers, ratings)
    return ratings


def _wanted_matchups(args, writers: dict[str, dict], rubric, ignored: list[str], judge_brief) -> list[dict]:
    """Every pairwise judgement the rating needs: each pair of checkpoints' matchups on their two best
    iterations, each shown in both orders, keyed so that a stored reply is never asked for again."""
    negative = set(rubric.negative)
    names = sorted(writers)
    pieces: dict[str, dict[str, dict[str, dict]]] = {}
    tops: dict[str, list[str]] = {}
    for name in names:
        by_iter: dict[str, dict[str, dict]] = {}
        for r in writers[name]["records"]:
            by_iter.setdefault(str(r["iteration"]), {})[str(r["prompt_id"])] = r
        pieces[name] = by_iter
        tops[name] = rt.top_iterations(iteration_scores(writers[name]["records"], negative), 2)
    wanted: list[dict] = []
    for i, test in enumerate(names):
        for other in names[i + 1 :]:
            texts_t = {it: {p: r["piece"] for p, r in ps.items()} for it, ps in pieces[test].items()}
            texts_o = {it: {p: r["piece"] for p, r in ps.items()} for it, ps in pieces[other].items()}
            for prompt, ti, oi in rt.matchups(
                texts_t, tops[test], texts_o, tops[other], args.rate_budget, ignored
            ):
                rec_t, rec_o = pieces[test][ti][prompt], pieces[other][oi][prompt]
                if rec_t.get("template", rec_t["brief"]) != rec_o.get("template", rec_o["brief"]):
                    continue  # the same prompt id from another prompt file: not comparable
                shown = judge_brief(rec_t, args)
                a_text = rec_t["piece"][: args.pairwise_max_chars]
                b_text = rec_o["piece"][: args.pairwise_max_chars]
                for a, ia, ta, b, ib, tb in (
                    (test, ti, a_text, other, oi, b_text),
                    (other, oi, b_text, test, ti, a_text),
                ):
                    prompt_text = pairwise_prompt(rubric, shown, ta, tb)
                    key = f"{prompt}|{a}|{ia}|{b}|{ib}|{_sha(prompt_text)}"
                    wanted.append(
                        {
                            "key": key,
                            "item": prompt,
                            "a": a,
                            "iter_a": ia,
                            "b": b,
                            "iter_b": ib,
                            "prompt": prompt_text,
                        }
                    )
    return wanted


def _judge_missing(args, missing: list[dict], store: KeyedJsonl) -> None:
    """Ask the judge for `missing` in batches of 64, storing each batch's replies as they come."""
    if not missing:
        return
    from infra.llm.client import LLMClientError

    try:
        judge = judge_client(args)
        for start in range(0, len(missing), 64):
            batch = missing[start : start + 64]
            replies = judge.complete_many(
                [[{"role": "user", "content": w["prompt"]}] for w in batch],
                temperature=0.0,
                max_tokens=args.pairwise_max_tokens,
                max_concurrency=args.judge_concurrency,
            )
            store.add(
                [{k: v for k, v in w.items() if k != "prompt"} | {"reply": r} for w, r in zip(batch, replies)]
            )
    except (LLMClientError, ValueError) as exc:
        raise EvalError(
            f"judge {args.judge_model}: {exc}. Replies received so far are kept in {store.path}; "
            "rerun the same command to judge the rest"
        ) from None


def _read_verdicts(args, wanted: list[dict], store: KeyedJsonl) -> tuple[list[rt.Judgement], int]:
    """The parsed judgements of `wanted` and how many replies could not be parsed."""
    parse = pw.parse_verdict if args.pairwise_parse == "exact" else pw.parse_verdict_upstream
    judgements = []
    n_failed = 0
    for w in wanted:
        verdict = parse(store.rows[w["key"]]["reply"])
        if verdict is None:
            n_failed += 1
            continue
        judgements.append(rt.Judgement(w["item"], w["a"], w["iter_a"], w["b"], w["iter_b"], *verdict))
    return judgements, n_failed


def _log(writers: dict[str, dict], ratings: dict[str, rt.WriterRating]) -> None:
    from evals.common.checkpoints import CheckpointRef
    from evals.common.mlflow_log import log_eval_metrics

    for name, r in ratings.items():
        s = writers[name]["summary"]
        ref = CheckpointRef(
            path=Path(s.get("checkpoint", name)), run_id=s.get("run_id"), step=s.get("step"), name=name
        )
        log_eval_metrics(
            ref,
            SUITE_NAME,
            {
                "rating": r.rating,
                "rating_ci_lo": r.ci_lo,
                "rating_ci_hi": r.ci_hi,
                "rating_norm": r.rating_norm,
                "rating_matchups": float(r.n_matchups),
            },
        )


def _parse_anchors(text: str | None) -> dict[str, float]:
    """'ckptA=1500,ckptB=200' -> {ckptA: 1500.0, ckptB: 200.0}."""
    out: dict[str, float] = {}
    for part in [p.strip() for p in (text or "").split(",") if p.strip()]:
        name, _, value = part.rpartition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise EvalError(f"--rate-anchors: {part!r} is not NAME=RATING (e.g. step_000100=1500)") from None
        if not name:
            raise EvalError(f"--rate-anchors: {part!r} is not NAME=RATING (e.g. step_000100=1500)")
    return out


def _ignored_prompts(spec: str | None, writers: dict[str, dict]) -> list[str]:
    """--rate-ignore-prompts: a comma list, or by default upstream's list for pieces of upstream's v3
    prompt file (prompt ids of other files are not upstream's)."""
    if spec is not None:
        return [p.strip() for p in spec.split(",") if p.strip()]
    sets = {r.get("prompt_set") for w in writers.values() for r in w["records"]}
    return list(rt.UPSTREAM_IGNORED_PROMPTS) if sets == {UPSTREAM_PROMPT_FILE} else []
