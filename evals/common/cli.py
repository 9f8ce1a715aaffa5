"""The command line every suite shares: `python -m evals.<suite> --ckpt ... [options]`.

For each checkpoint `--ckpt` names: load it into the generator (one engine for all of them: weights are
swapped in memory when the architecture matches), run the suite's items in batches (appending each
batch's records to samples.jsonl, skipping items already there with the same content and suite options),
summarise, write summary.json and log `eval/<suite>/<metric>` to the checkpoint's MLflow run at its step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from evals.common.checkpoints import CheckpointNotFound, CheckpointRef, resolve
from evals.common.generation import GenerationError, ServerGenerator, VLLMGenerator
from evals.common.mlflow_log import log_eval_metrics
from evals.common.results import FINGERPRINT_KEY, ResultsError, ResultsStore
from evals.common.suite import EvalContext, Suite
from infra.models import PROJECT_ROOT

DEFAULT_RESULTS_DIR = PROJECT_ROOT / "outputs" / "evals"


class EvalError(RuntimeError):
    """Bad suite output or input (one-line message)."""


def add_common_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("checkpoint, generation and results (shared by all suites)")
    g.add_argument(
        "--ckpt",
        required=True,
        help="checkpoint folder (step_N, run folder or HF model folder), MLflow run id, sweep name, or 'latest'",
    )
    g.add_argument(
        "--step", type=int, default=None, help="with a run id/sweep/run folder: this step's checkpoint"
    )
    g.add_argument("--server", default=None, help="OpenAI-compatible server URL instead of in-process vLLM")
    g.add_argument("--server-model", default=None, help="model name on --server (default: its first model)")
    g.add_argument(
        "--server-api-key-env",
        default=None,
        help="env variable whose key is sent to --server (none sent otherwise, except $OPENAI_API_KEY to "
        "api.openai.com)",
    )
    g.add_argument("--limit", type=int, default=None, help="only the first N items (quick runs)")
    g.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="default: outputs/evals")
    g.add_argument("--batch-size", type=int, default=64, help="items per generation batch (and per append)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (each sample derives its own)")
    g.add_argument(
        "--max-model-len", type=int, default=4096, help="vLLM context length (prompt + completion)"
    )
    g.add_argument("--no-mlflow", action="store_true", help="write results files only")


def build_parser(suite: Suite) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m evals.{suite.name}", description=f"eval suite {suite.name}"
    )
    add_common_args(parser)
    suite.add_args(parser)
    return parser


def make_generator(args: argparse.Namespace, engine=None):
    """`--server URL` -> ServerGenerator, else in-process vLLM (adopting `engine` if given)."""
    if args.server:
        return ServerGenerator(args.server, model=args.server_model, api_key_env=args.server_api_key_env)
    return VLLMGenerator(max_model_len=args.max_model_len, engine=engine)


def _check_items(items: list[dict], suite: str) -> list[str]:
    ids = []
    for i, item in enumerate(items):
        if "id" not in item:
            raise EvalError(f"suite {suite}: item {i} has no 'id'")
        ids.append(str(item["id"]))
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise EvalError(f"suite {suite}: item id {dup!r} is not unique")
    return ids


def select_items(items: list[dict], args: argparse.Namespace, suite: str) -> list[dict]:
    """The items to evaluate (the first `--limit`); none at all is an error, not an empty success."""
    chosen = items if args.limit is None else items[: args.limit]
    if not chosen:
        why = f"--limit {args.limit} selects none" if items else "its data is empty (check the data files)"
        raise EvalError(f"suite {suite}: no items to evaluate: {why}; nothing was run")
    return chosen


def result_settings(suite: Suite, args: argparse.Namespace) -> dict:
    """The options that change a suite's results: its own options and the sampling seed, less those the
    suite lists in `summary_options` (they change only how stored records are summarised)."""
    own = argparse.ArgumentParser(add_help=False)
    suite.add_args(own)
    keys = ({a.dest for a in own._actions} | {"seed"}) - set(getattr(suite, "summary_options", ()))
    return {k: getattr(args, k, None) for k in sorted(keys)}


def item_fingerprint(item: dict, settings: dict) -> str:
    """Hash of an item's content and the result settings: a stored record is reused only on a match.

    Item ids alone are not enough: `--qa-n 200` builds other problems under the ids `--qa-n 100` used,
    and a new `--max-tokens` must not reuse replies cut at the old length.
    """
    text = json.dumps([item, settings], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_suite(
    suite: Suite,
    args: argparse.Namespace,
    checkpoint: CheckpointRef,
    generator,
    items: list[dict] | None = None,
    progress: bool = True,
) -> dict:
    """Evaluate one checkpoint with one suite (resuming), write summary.json, log to MLflow; return the summary."""
    from tqdm import tqdm

    items = select_items(suite.load_items(args) if items is None else items, args, suite.name)
    ids = _check_items(items, suite.name)
    store = ResultsStore(args.results_dir, checkpoint.name, suite.name, getattr(suite, "record_schema", None))
    settings = result_settings(suite, args)
    fingerprints = {i: item_fingerprint(item, settings) for item, i in zip(items, ids)}
    todo = [item for item, i in zip(items, ids) if store.fingerprint(i) != fingerprints[i]]
    started = time.time()
    store.check_writable()  # before generating: a refused write would throw the batch away
    if todo:
        generator.load(checkpoint.path)
    ctx = EvalContext(args=args, checkpoint=checkpoint, generator=generator, results_dir=store.dir)
    bar = tqdm(
        total=len(items),
        initial=len(items) - len(todo),
        desc=f"{suite.name} {checkpoint.name}",
        unit="item",
        disable=not progress,
        file=sys.stderr,
    )
    _run_batches(suite, todo, ctx, store, fingerprints, bar)
    bar.close()
    metrics = suite.summarize(store.records(ids), args)
    summary = {
        "suite": suite.name,
        "checkpoint": str(checkpoint.path),
        "checkpoint_name": checkpoint.name,
        "run_id": checkpoint.run_id,
        "step": checkpoint.step,
        "n_items": len(ids),
        "n_new": len(todo),
        "seconds": round(time.time() - started, 3),
        "metrics": metrics,
    }
    store.write_summary(summary)
    if not getattr(args, "no_mlflow", False):
        summary["mlflow_run_id"] = log_eval_metrics(checkpoint, suite.name, metrics)
        store.write_summary(summary)
    return summary


def _run_batches(
    suite: Suite, todo: list[dict], ctx: EvalContext, store: ResultsStore, fingerprints, bar
) -> None:
    """Run the suite on `todo` in batches of --batch-size, storing each batch's records (stamped with their
    item's fingerprint) as soon as it is done, so an interrupted run resumes after the last batch."""
    size = ctx.args.batch_size
    for start in range(0, len(todo), size):
        batch = todo[start : start + size]
        records = suite.run_batch(batch, ctx)
        want = {str(it["id"]) for it in batch}
        got = {str(r.get("id")) for r in records}
        if got != want:
            raise EvalError(f"suite {suite.name}: run_batch returned records for {sorted(got ^ want)[:3]}...")
        for r in records:
            r[FINGERPRINT_KEY] = fingerprints[str(r["id"])]
        store.append(records)
        bar.update(len(batch))


def format_metrics(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def main(suite: Suite, argv: list[str] | None = None, generator=None) -> list[dict]:
    """Entry point of `python -m evals.<suite>`; exits with a one-line `error: ...` on bad input.

    `generator` lets a caller (tests, evals.watch) lend its own generator; it is not closed here.
    """
    from data_prep.schema import DatasetError

    args = build_parser(suite).parse_args(argv)
    owned = generator is None
    summaries = []
    try:
        items = select_items(suite.load_items(args), args, suite.name)
        checkpoints = resolve(args.ckpt, args.step)
        for checkpoint in checkpoints:  # every results folder is writable before any engine starts
            ResultsStore(args.results_dir, checkpoint.name, suite.name).check_writable()
        if owned:
            generator = make_generator(args)
        for checkpoint in checkpoints:
            summary = run_suite(suite, args, checkpoint, generator, items=items)
            summaries.append(summary)
            print(f"[eval] {suite.name} {checkpoint.name}: {format_metrics(summary['metrics'])}")
            print(f"[eval] results {Path(args.results_dir) / checkpoint.name / suite.name}")
    except (
        CheckpointNotFound,
        GenerationError,
        DatasetError,
        EvalError,
        ResultsError,
        FileNotFoundError,
    ) as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        if owned and generator is not None:
            generator.close()
    return summaries
