"""Where the samples viewer (analysis/view.py) finds its samples: the training runs' logged samples
(`samples/{val,train}/<step>.jsonl` artifacts of MLflow runs, train/samples.py) and the eval results
folders (`<results-dir>/<checkpoint>/<suite>/samples.jsonl`, indexed by analysis/sample_index.py).

Every problem found on the way (no store, a run without samples, a bad line) is returned as one line
for the page; what can be read is still shown.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import Counter
from pathlib import Path

from analysis.json_lines import describe, parse_line
from analysis.sample_index import SampleIndex
from analysis.turns import labelled
from infra.tracking import SAMPLES_ARTIFACT_DIR

MLFLOW_UI = "http://127.0.0.1:5000"  # `make ui`
MAX_RUNS = 100
STEP_CHOICES = ("all", "ends")  # a collapse's steps: every logged one, or the first and the last


# ---- training samples: the runs' artifacts ---------------------------------------------------------


def _local_dir(artifact_uri: str) -> Path | None:
    if artifact_uri.startswith("file://"):
        return Path(urllib.parse.urlparse(artifact_uri).path)
    return Path(artifact_uri) if artifact_uri.startswith("/") else None


class RunSamples:
    """The logged samples of the selected MLflow runs, read from their artifacts (cached per file)."""

    def __init__(self, runs: list[dict], uri: str | None = None) -> None:
        self.runs = {r["run_id"]: r for r in runs}
        self.uri = uri
        self._cache: dict[tuple[str, float], tuple[list[dict], list[str]]] = {}
        self._lock = threading.Lock()

    def _files(self, run: dict, kind: str) -> list[Path]:
        local = _local_dir(run["artifact_uri"])
        if local is None:  # a remote artifact store: copy the samples folder once
            import mlflow

            local = Path(
                mlflow.artifacts.download_artifacts(
                    run_id=run["run_id"], artifact_path=SAMPLES_ARTIFACT_DIR, tracking_uri=self.uri
                )
            ).parent
        return sorted((local / SAMPLES_ARTIFACT_DIR / kind).glob("*.jsonl"))  # the tables are *.table.json

    def records(self, run_id: str, kind: str) -> tuple[list[dict], list[str]]:
        """(records of every logged step, one-line problems) of one run."""
        run = self.runs.get(run_id)
        if run is None:
            return [], [f"run {run_id} is not among the runs this viewer was started on"]
        try:
            files = self._files(run, kind)
        except Exception as exc:  # noqa: BLE001 - a store problem is a line on the page
            return [], [f"run {run['label']}: cannot read its samples: {str(exc).splitlines()[0][:120]}"]
        records, errors = [], []
        for path in files:
            key = (str(path), path.stat().st_mtime)
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = _read_jsonl(path, f"run {run['label']}: {kind}/{path.name}")
            got, bad = self._cache[key]
            records += got
            errors += bad
        if not files:
            errors.append(
                f"run {run['label']}: no {kind} samples logged (a run from before sample logging, or "
                f"track=false, log_samples_every=0{', val_every=0' if kind == 'val' else ''})"
            )
        return records, errors

    def prompts(self, run_ids: list[str], kind: str) -> tuple[list[dict], list[str]]:
        """The prompts to choose from, the clearest contrast first: by how much the runs' numbers of
        distinct classes at their last common step differ (then by text)."""
        seen: dict[str, dict[str, dict]] = {}
        errors: list[str] = []
        groups: set[int] = set()
        for rid in run_ids:
            records, bad = self.records(rid, kind)
            errors += bad
            for r in records:
                seen.setdefault(r["prompt_key"], {}).setdefault(rid, {})[r["step"]] = r
                groups.add(r["group"])
        out = []
        for prompt, by_run in seen.items():
            steps = set.intersection(*(set(s) for s in by_run.values()))
            last = max(steps) if steps and len(by_run) == len(run_ids) else None
            spreads = [distinct(by_run[rid][last]) for rid in by_run] if last is not None else []
            out.append(
                {
                    "key": f"prompt:{prompt}",
                    "label": prompt,
                    "steps": len({s for st in by_run.values() for s in st}),
                    "contrast": (max(spreads) - min(spreads)) if spreads else -1,
                }
            )
        out.sort(key=lambda p: (-p["contrast"], -p["steps"], p["label"]))
        if kind == "train":  # training prompts rarely repeat: first the k-th group of each step (the
            out = [  # same prompts in the arms of one seed, which draw the same prompts)
                {"key": f"group:{g}", "label": f"group {g} of each step", "steps": 0, "contrast": -1}
                for g in sorted(groups)
            ] + out
        return out, errors

    def collapse(self, run_ids: list[str], kind: str, key: str, steps: str = "all") -> dict:
        """Each run's group for `key` (prompt:<text> | group:<k>) at every logged step, or with
        `steps="ends"` at the first and the last step any of the runs logged it (for validation samples:
        step 0, before RL, and the end)."""
        if steps not in STEP_CHOICES:
            raise ValueError(f"steps={steps!r}: use {' or '.join(STEP_CHOICES)}")
        errors: list[str] = []
        cells: dict[str, dict[int, dict]] = {}
        for rid in run_ids:
            records, bad = self.records(rid, kind)
            errors += bad
            if key.startswith("group:"):
                mine = [r for r in records if str(r["group"]) == key.removeprefix("group:")]
            else:
                mine = [r for r in records if r["prompt_key"] == key.removeprefix("prompt:")]
            cells[rid] = {r["step"]: r for r in mine}
        logged = sorted({s for c in cells.values() for s in c})
        shown = logged[:1] + logged[-1:] if steps == "ends" and len(logged) > 1 else logged
        runs = [
            {k: self.runs[rid][k] for k in ("run_id", "label", "arm", "link")}
            | {"cells": {str(s): cells[rid].get(s) for s in shown}}
            for rid in run_ids
            if rid in self.runs
        ]
        return {"kind": kind, "key": key, "steps": shown, "runs": runs, "errors": errors}


def distinct(record: dict) -> int:
    """Distinct partition classes in a logged group (else distinct extracted answers, else texts)."""
    return len({class_key(r) for r in record["responses"]})


def class_key(response: dict) -> str:
    if response.get("class") is not None:
        return f"class {response['class']}"
    if response.get("answer") is not None:
        return f"answer {response['answer']}"
    return f"text {response.get('text', '').strip()}"


def _read_jsonl(path: Path, where: str) -> tuple[list[dict], list[str]]:
    """The records of one logged step; `prompt_key` tells repeated prompts apart (text, then "(#n)").
    A line that is not a samples record is skipped with one line naming it and its field."""
    records, errors = [], []
    seen: Counter[str] = Counter()
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        r, why = parse_line(line)
        if why is None:
            why = _record_problem(r)
        if why is not None:
            errors.append(f"{where}: line {n} {why} (skipped)")
            continue
        r.setdefault("prompt", "")
        r.setdefault("group", 0)
        for response in r["responses"]:  # multi-turn: each turn's writer, model / tool / user
            if isinstance(response.get("turns"), list):
                response["turns"] = labelled(response["turns"])
        # the n-th group of a prompt the data holds several times (same order at every step)
        r["prompt_key"] = r["prompt"] + (f" (#{seen[r['prompt']] + 1})" if seen[r["prompt"]] else "")
        seen[r["prompt"]] += 1
        records.append(r)
    return records, errors


def _record_problem(r) -> str | None:
    """Why a parsed line is not a samples record (train/samples.py), naming the field; None: it is."""
    if not isinstance(r, dict):
        return f"is {describe(r)}, not a samples record (a JSON object)"
    if "step" not in r:
        return "has no field 'step': not a samples record"
    for field, default in (("step", 0), ("group", 0)):
        value = r.get(field, default)
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 2**53:
            return f"field {field!r} is {describe(value)}, not a {field} number"
    if not isinstance(r.get("prompt", ""), str):
        return f"field 'prompt' is {describe(r['prompt'])}, not a text"
    responses = r.get("responses")
    if not isinstance(responses, list):
        return f"field 'responses' is {describe(responses)}, not a list of responses"
    for i, response in enumerate(responses):
        if not isinstance(response, dict):
            return f"field 'responses' item {i} is {describe(response)}, not a response (a JSON object)"
        if not isinstance(response.get("text", ""), str):
            return f"field 'responses' item {i}'s 'text' is {describe(response['text'])}, not a text"
    return None


def _named_runs(c, run_ids: list[str], uri, errors: list[str]) -> list[dict]:
    """The rows of `--run` ids; an unknown id is a line in `errors`."""
    from analysis.store import group_label
    from infra.tracking import tracking_uri

    rows = []
    for rid in run_ids:
        try:
            run = c.get_run(rid)
        except Exception:  # noqa: BLE001 - a wrong id is a line on the page
            errors.append(f"--run {rid}: no such MLflow run in {uri or tracking_uri()}")
            continue
        rows.append(
            {
                "run_id": rid,
                "run_name": run.info.run_name or rid[:8],
                "arm": group_label(run.data.tags.get("rlpost.grid_point"), run.info.run_name or rid[:8]),
                "seed": run.data.params.get("seed", ""),
            }
        )
    return rows


def _experiment_runs(experiment: str | None, sweep: str | None, uri) -> list[dict] | None:
    """The rows of an experiment's runs (its newest sweep, or `sweep`), by arm and name, at most MAX_RUNS;
    None when the store holds none of its runs."""
    from analysis.arms import experiment_arms, select_runs, with_arms
    from analysis.store import load_runs

    table = load_runs(experiment, sweep=sweep, uri=uri)
    if table.empty:
        return None
    table = with_arms(table, experiment_arms(experiment) if experiment else {})
    table = select_runs(table, sweep) if experiment else table
    return [
        {
            "run_id": r["run_id"],
            "run_name": r["run_name"],
            "arm": r["arm"],
            "seed": r.get("param:seed", "") if isinstance(r.get("param:seed", ""), str) else "",
        }
        for _, r in table.sort_values(["arm", "run_name"]).head(MAX_RUNS).iterrows()
    ]


def find_runs(
    experiment: str | None = None, sweep: str | None = None, run_ids: list[str] | None = None, uri=None
) -> tuple[list[dict], list[str]]:
    """The runs to show: `run_ids`, else the experiment's (its newest sweep, or `sweep`), labelled by
    arm and seed. Returns (runs, one-line problems)."""
    from analysis.store import client
    from infra.tracking import store_exists, tracking_uri

    if not store_exists(uri):
        return [], [
            f"no MLflow store at {uri or tracking_uri()} (train a run first, or set MLFLOW_TRACKING_URI)"
        ]
    c = client(uri)
    errors: list[str] = []
    if run_ids:
        rows = _named_runs(c, run_ids, uri, errors)
    else:
        rows = _experiment_runs(experiment, sweep, uri)
        if rows is None:
            what = f"experiment {experiment}" if experiment else "the store"
            return [], [
                f"no runs in {what}{f' for sweep {sweep}' if sweep else ''} ({uri or tracking_uri()})"
            ]
    runs = []
    for row in rows:
        info = c.get_run(row["run_id"]).info
        seed = f" seed {row['seed']}" if row["seed"] else ""
        runs.append(
            row
            | {
                "label": f"{row['arm']}{seed}",
                "artifact_uri": info.artifact_uri,
                "link": f"{MLFLOW_UI}/#/experiments/{info.experiment_id}/runs/{row['run_id']}",
            }
        )
    return runs, errors


# ---- eval samples: <results-dir>/<checkpoint>/<suite>/samples.jsonl ---------------------------------


class EvalSamples:
    """The eval results folders, each with its index (built on first use, refreshed when the file grows)."""

    def __init__(
        self, results_dir: Path, checkpoints: list[str] | None = None, uri: str | None = None
    ) -> None:
        self.root = Path(results_dir)
        self.errors: list[str] = []
        self.entries: dict[str, dict] = {}
        self._indexes: dict[str, SampleIndex] = {}
        self._lock = threading.Lock()
        if not self.root.is_dir():
            self.errors.append(f"no eval results in {self.root} (run python -m evals.<suite> --ckpt ...)")
            return
        for path in sorted(self.root.glob("*/*/samples.jsonl")):
            ckpt, suite = path.parent.parent.name, path.parent.name
            if checkpoints and ckpt not in checkpoints:
                continue
            summary = _summary(path.parent / "summary.json")
            self.entries[f"{ckpt}/{suite}"] = {
                "key": f"{ckpt}/{suite}",
                "ckpt": ckpt,
                "suite": suite,
                "run_id": summary.get("run_id"),
                "step": summary.get("step"),
                "n_items": summary.get("n_items"),
                "link": _run_link(summary.get("run_id"), uri),
            }
        if checkpoints:
            missing = [c for c in checkpoints if not any(e["ckpt"] == c for e in self.entries.values())]
            self.errors += [f"--ckpt {c}: no results folder {self.root / c}" for c in missing]
        if not self.entries and not self.errors:
            self.errors.append(f"no samples.jsonl under {self.root}/<checkpoint>/<suite>/")

    def index(self, key: str) -> SampleIndex:
        if key not in self.entries:
            raise KeyError(f"no eval results {key!r} (known: {', '.join(list(self.entries)[:5]) or 'none'})")
        with self._lock:
            if key not in self._indexes:
                ckpt, suite = key.split("/", 1)
                self._indexes[key] = SampleIndex(self.root / ckpt / suite / "samples.jsonl", suite)
            idx = self._indexes[key]
        return idx.refresh()


def _summary(path: Path) -> dict:
    """An eval's summary.json (run id, step, items shown beside its name); {} when unreadable or damaged."""
    try:
        summary, _ = parse_line(path.read_text(errors="replace"))
    except OSError:
        return {}
    return summary if isinstance(summary, dict) else {}


def _run_link(run_id: str | None, uri: str | None) -> str | None:
    if not run_id:
        return None
    try:
        from analysis.store import client

        return f"{MLFLOW_UI}/#/experiments/{client(uri).get_run(run_id).info.experiment_id}/runs/{run_id}"
    except Exception:  # noqa: BLE001 - a link is a convenience; the run may live in another store
        return None


_MATH_PROMPTS: dict[str, dict[str, str]] = {}


def _math_prompt(sample: dict) -> str | None:
    """Math records keep no prompt (it is the dataset's): look it up by `<dataset>/<id>` in the data."""
    dataset, _, item = sample["id"].partition("/")
    if dataset not in _MATH_PROMPTS:
        from data_prep.math_jsonl import SOURCES, load_math_jsonl
        from data_prep.schema import extra_info_of
        from evals.math import default_data_dir

        path = default_data_dir() / dataset / "test.jsonl"
        prompts = {}
        if dataset in SOURCES and path.is_file():
            for row in load_math_jsonl(path, dataset):
                text = row["prompt"][-1]["content"] if isinstance(row["prompt"], list) else row["prompt"]
                prompts[str(extra_info_of(row).get("id"))] = text
        _MATH_PROMPTS[dataset] = prompts
    return _MATH_PROMPTS[dataset].get(item)


def with_prompts(samples: list[dict], suite: str) -> list[dict]:
    for s in samples:
        if s.get("prompt") is None and suite == "math":
            s["prompt"] = _math_prompt(s)
    return samples
