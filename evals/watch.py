"""Evaluate every new checkpoint of a run, a sweep or an experiment, once, as training writes them.

    python -m evals.watch --dir outputs/grpo_math/sweeps/<sweep> --suites math --datasets math500 --limit 100
    python -m evals.watch --sweep <sweep id> --suites math,novelty --launcher slurm --cluster local
    python -m evals.watch --experiment grpo_math --suites math --once

Sources: `--dir` (a run folder, or any folder holding run folders: every `checkpoints/step_N` below it),
`--sweep` (the training runs tagged `rlpost.sweep`), `--experiment` (every run of an MLflow experiment).
Only complete checkpoints are read (train/checkpoint.py writes a hidden temporary folder, marks it
complete last, and renames it; an incomplete step folder is skipped).

Each (checkpoint, suite) pair is done once: the state file (default `<results-dir>/watch_state.json`)
records it, so a restarted watcher does not redo it; an eval that crashed is retried on the next pass and
resumes from its samples.jsonl. In-process evals share one vLLM engine (weights swapped per checkpoint);
with `--launcher local|slurm` each new checkpoint becomes one submitit job running its suites.
Options not listed below go to the suites (e.g. `--datasets`, `--limit`, `--n`, `--results-dir`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from evals.common.checkpoints import (
    CheckpointNotFound,
    CheckpointRef,
    all_checkpoints_of_run,
    step_folder_ref,
    sweep_runs,
)
from evals.common.cli import DEFAULT_RESULTS_DIR, build_parser, make_generator, run_suite
from evals.common.generation import GenerationError
from infra.checkpoint import layout as ckpt
from infra.tracking import mlflow_client, tracking_uri


def load_suite(name: str):
    """The `SUITE` object of `evals.<name>`."""
    try:
        module = importlib.import_module(f"evals.{name}")
    except ModuleNotFoundError:
        raise SystemExit(f"error: no eval suite evals.{name} (check --suites)") from None
    if not hasattr(module, "SUITE"):
        raise SystemExit(f"error: evals.{name} defines no SUITE object")
    return module.SUITE


def _run_dirs_below(root: Path) -> list[Path]:
    if ckpt.is_run_dir(root):
        return [root]
    return sorted(p.parent for p in root.rglob("checkpoints") if p.is_dir() and not p.name.startswith("."))


def discover(args: argparse.Namespace) -> list[CheckpointRef]:
    """Complete checkpoints of the watched source, oldest step first within each run."""
    refs: list[CheckpointRef] = []
    if args.dir:
        for run_dir in _run_dirs_below(Path(args.dir).resolve()):
            for _, folder in ckpt.list_checkpoints(run_dir):
                try:
                    refs.append(step_folder_ref(folder))
                except CheckpointNotFound:
                    continue  # pruned or half-deleted meanwhile
        return refs

    if args.sweep:
        runs = sweep_runs(args.sweep)
    else:
        client = mlflow_client()
        exp = client.get_experiment_by_name(args.experiment)
        if exp is None:
            raise SystemExit(f"error: no MLflow experiment {args.experiment!r} in {tracking_uri()}")
        runs = client.search_runs([exp.experiment_id], "tags.`rlpost.kind` != 'sweep'", max_results=10_000)
    for run in runs:
        refs.extend(all_checkpoints_of_run(run))
    return refs


class WatchState:
    """`{"<checkpoint path>::<suite>": {"status": "done"|"submitted", ...}}`, rewritten atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict] = json.loads(path.read_text()) if path.is_file() else {}

    @staticmethod
    def key(ref: CheckpointRef, suite: str) -> str:
        return f"{ref.path}::{suite}"

    def has(self, ref: CheckpointRef, suite: str) -> bool:
        return self.key(ref, suite) in self.entries

    def mark(self, ref: CheckpointRef, suite: str, **info) -> None:
        self.entries[self.key(ref, suite)] = {"time": time.time(), "step": ref.step, **info}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.entries, indent=1))
        os.replace(tmp, self.path)


def suite_args(suite, passthrough: list[str], ref: CheckpointRef) -> argparse.Namespace:
    """The suite's own parser applied to the pass-through options (options of other suites ignored)."""
    args, _ = build_parser(suite).parse_known_args(["--ckpt", str(ref.path), *passthrough])
    return args


def evaluate(ref: CheckpointRef, suite_names: list[str], passthrough: list[str], generator=None) -> dict:
    """Run the suites on one checkpoint (what a submitit job runs); returns suite -> metrics."""
    owned = generator is None
    out = {}
    try:
        for name in suite_names:
            suite = load_suite(name)
            args = suite_args(suite, passthrough, ref)
            if generator is None:
                generator = make_generator(args)
            out[name] = run_suite(suite, args, ref, generator, progress=False)["metrics"]
    finally:
        if owned and generator is not None:
            generator.close()
    return out


def watch_once(args: argparse.Namespace, passthrough: list[str], state: WatchState, generator=None) -> int:
    """One pass: evaluate (or submit) every checkpoint/suite pair not in the state file; returns how many."""
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    for name in suites:
        load_suite(name)  # fail now on a typo, not at the first checkpoint
    executor = None
    count = 0
    for ref in discover(args):
        todo = [s for s in suites if not state.has(ref, s)]
        if not todo:
            continue
        if args.launcher:
            if executor is None:
                from infra.executors import make_executor

                executor = make_executor(args.launcher, Path(args.state).parent / "watch_logs", args.cluster)
                executor.update_parameters(name="evals-watch")
            job = executor.submit(evaluate, ref, todo, passthrough)
            for s in todo:
                state.mark(ref, s, status="submitted", job_id=str(job.job_id))
            print(f"[watch] {ref.name}: submitted {','.join(todo)} as job {job.job_id}", flush=True)
            count += len(todo)
            continue
        for s in todo:
            try:
                metrics = evaluate(ref, [s], passthrough, generator)[s]
            except (CheckpointNotFound, GenerationError) as exc:
                print(f"[watch] {ref.name} {s}: skipped this pass: {exc}", flush=True)
                continue
            state.mark(ref, s, status="done")
            shown = " ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:6])
            print(f"[watch] {ref.name} {s}: {shown}", flush=True)
            count += 1
    return count


def build_watch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evals.watch",
        description=__doc__.splitlines()[0],
        epilog="other options go to the suites",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--dir", help="a run folder, or a folder holding run folders (e.g. a sweep's)")
    src.add_argument("--sweep", help="sweep id (MLflow tag rlpost.sweep)")
    src.add_argument("--experiment", help="MLflow experiment name")
    parser.add_argument("--suites", default="math", help="comma list of evals.<suite> modules")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument("--state", default=None, help="state file (default <results-dir>/watch_state.json)")
    parser.add_argument(
        "--launcher", choices=["local", "slurm"], default=None, help="submit one job per checkpoint"
    )
    parser.add_argument("--cluster", default=None, help="Slurm cluster profile (slurm/<name>.yaml)")
    return parser


def main(argv: list[str] | None = None, generator=None) -> int:
    args, passthrough = build_watch_parser().parse_known_args(argv)
    results = DEFAULT_RESULTS_DIR
    if "--results-dir" in passthrough:
        results = Path(passthrough[passthrough.index("--results-dir") + 1])
    args.state = Path(args.state) if args.state else results / "watch_state.json"
    state = WatchState(args.state)
    owned = generator is None and not args.launcher
    if owned:
        # One generator for the whole watch (weights swapped per checkpoint); the engine starts on first use.
        first = load_suite(args.suites.split(",")[0].strip())
        common, _ = build_parser(first).parse_known_args(["--ckpt", "-", *passthrough])
        generator = make_generator(common)
    try:
        while True:
            n = watch_once(args, passthrough, state, generator)
            if args.once:
                print(f"[watch] pass done: {n} evaluation(s); state {args.state}", flush=True)
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if owned and generator is not None:
            generator.close()


if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    sys.exit(main())
