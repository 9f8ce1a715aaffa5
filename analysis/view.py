"""`python -m analysis.view` (`make view`): the samples behind the numbers, in a local browser page.

Three pages, one server (Python's http.server on 127.0.0.1 only; plain HTML/JS in analysis/view_page,
no network, no build step):

- collapse: one prompt across training steps, one column per run (arm): the group's answers at each
  logged step, coloured by partition class, from the runs' `samples/{val,train}/<step>.jsonl`
  artifacts (train/samples.py). Validation samples repeat the same held-out prompts at every
  validation, so they show one prompt's group narrowing (GRPO) or staying spread (DARLING);
- evals: one checkpoint's samples of one suite (`<results-dir>/<checkpoint>/<suite>/samples.jsonl`),
  filtered and paged on the server over an index (analysis/sample_index.py): the browser holds one page;
- compare: two checkpoints on the same items, what changed, with links to their MLflow runs.

    python -m analysis.view [--experiment EXP] [--sweep ID] [--run RUN_ID ...] [--ckpt NAME ...]
                            [--results-dir outputs/evals] [--port 8765] [--no-browser]

Problems with the inputs (no samples logged, a bad line in a file, no eval results) are one line each
on the page, and the rest is shown.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.parse
import webbrowser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from analysis.sample_index import Filters, SampleIndex, compare
from train.models import PROJECT_ROOT
from train.samples import ARTIFACT_DIR

PAGE_DIR = Path(__file__).with_name("view_page")
STATIC = {"/": "index.html", "/view.js": "view.js", "/view.css": "view.css"}
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
DEFAULT_PORT = 8765  # the report's links point here (analysis/report.py)
DEFAULT_RESULTS_DIR = PROJECT_ROOT / "outputs" / "evals"
MLFLOW_UI = "http://127.0.0.1:5000"  # `make ui`
MAX_RUNS = 100
REDISCOVER_S = 10.0  # a page load looks for new runs and eval results at most this often
KINDS = ("val", "train")


def viewer_url(page: str, port: int = DEFAULT_PORT, **query: object) -> str:
    """A link to one page of the viewer with its selection, e.g. viewer_url("collapse", runs="a,b")."""
    q = urllib.parse.urlencode({k: v for k, v in query.items() if v not in (None, "")})
    return f"http://127.0.0.1:{port}/#{page}" + (f"?{q}" if q else "")


def metric_page(metric: str) -> tuple[str, dict[str, str]]:
    """The viewer page holding the samples behind `metric`: val/* -> validation samples across steps,
    eval/<suite>/* -> that suite's eval samples, anything else logged in training -> training rollouts."""
    if metric.startswith("eval/"):
        return "evals", {"suite": metric.split("/")[1]}
    return "collapse", {"kind": "val" if metric.startswith("val/") else "train"}


def report_links(runs, order: list[str], metrics: list[str], port: int = DEFAULT_PORT) -> str:
    """HTML for the report (analysis/report.py): each arm's and each metric's samples in the viewer.

    `runs`: the report's run table (run_id, arm or group); `metrics`: the metric columns to link."""
    import html

    if runs.empty:
        return "<p>No runs: no samples to show.</p>"
    col = "arm" if "arm" in runs else "group"
    arms = order or sorted({str(a) for a in runs[col]})
    ids = {a: list(runs[runs[col] == a]["run_id"]) for a in arms}
    paired = ",".join(v[0] for v in ids.values() if v)  # one run per arm: the collapse side by side

    def link(page: str, label: str, **query) -> str:
        return f'<a href="{html.escape(viewer_url(page, port, **query))}">{html.escape(label)}</a>'

    rows = "".join(
        f"<tr><td>{html.escape(a)}</td><td>{link('collapse', 'validation samples by step', runs=','.join(v), kind='val')}"
        f"</td><td>{link('collapse', 'training rollouts', runs=','.join(v), kind='train')}</td>"
        f"<td>{link('evals', 'eval samples', run=v[-1])}</td></tr>"
        for a, v in ids.items()
        if v
    )
    per_metric = []
    for m in metrics:
        page, query = metric_page(m)
        query |= {"runs": paired} if page == "collapse" else {"run": next(iter(ids.values()))[0]}
        per_metric.append(link(page, m, **query))
    return (
        f"<p class='meta'>Served by <code>make view</code> (python -m analysis.view) on 127.0.0.1:{port}; "
        "start it first. Side by side, one run per arm: "
        f"{link('collapse', 'the collapse view', runs=paired, kind='val')}.</p>"
        f'<table class="leaderboard samples-links"><thead><tr><th>arm</th><th colspan="3">its samples</th></tr>'
        f"</thead><tbody>{rows}</tbody></table>"
        f"<p class='meta'>Per metric: {' · '.join(per_metric)}</p>"
    )


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
                    run_id=run["run_id"], artifact_path=ARTIFACT_DIR, tracking_uri=self.uri
                )
            ).parent
        return sorted((local / ARTIFACT_DIR / kind).glob("*.jsonl"))  # the tables are *.table.json

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
                seen.setdefault(r["prompt"], {}).setdefault(rid, {})[r["step"]] = r
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

    def collapse(self, run_ids: list[str], kind: str, key: str) -> dict:
        """Each run's group for `key` (prompt:<text> | group:<k>) at every logged step."""
        errors: list[str] = []
        cells: dict[str, dict[int, dict]] = {}
        for rid in run_ids:
            records, bad = self.records(rid, kind)
            errors += bad
            if key.startswith("group:"):
                mine = [r for r in records if str(r["group"]) == key.removeprefix("group:")]
            else:
                mine = [r for r in records if r["prompt"] == key.removeprefix("prompt:")]
            cells[rid] = {r["step"]: r for r in mine}
        steps = sorted({s for c in cells.values() for s in c})
        runs = [
            {k: self.runs[rid][k] for k in ("run_id", "label", "arm", "link")}
            | {"cells": {str(s): cells[rid].get(s) for s in steps}}
            for rid in run_ids
            if rid in self.runs
        ]
        return {"kind": kind, "key": key, "steps": steps, "runs": runs, "errors": errors}


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
    records, errors = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not isinstance(r, dict) or not isinstance(r.get("responses"), list) or "step" not in r:
                raise ValueError("not a samples record")
            r.setdefault("prompt", "")
            r.setdefault("group", 0)
            records.append(r)
        except (ValueError, TypeError):
            errors.append(f"{where}: line {n} is not a samples record (skipped)")
    return records, errors


def find_runs(
    experiment: str | None = None, sweep: str | None = None, run_ids: list[str] | None = None, uri=None
) -> tuple[list[dict], list[str]]:
    """The runs to show: `run_ids`, else the experiment's (its newest sweep, or `sweep`), labelled by
    arm and seed. Returns (runs, one-line problems)."""
    from analysis.arms import experiment_arms, select_runs, with_arms
    from analysis.store import client, group_label, load_runs
    from train.tracking import store_exists, tracking_uri

    if not store_exists(uri):
        return [], [
            f"no MLflow store at {uri or tracking_uri()} (train a run first, or set MLFLOW_TRACKING_URI)"
        ]
    c = client(uri)
    errors: list[str] = []
    if run_ids:
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
    else:
        table = load_runs(experiment, sweep=sweep, uri=uri)
        if table.empty:
            what = f"experiment {experiment}" if experiment else "the store"
            return [], [
                f"no runs in {what}{f' for sweep {sweep}' if sweep else ''} ({uri or tracking_uri()})"
            ]
        table = with_arms(table, experiment_arms(experiment) if experiment else {})
        table = select_runs(table, sweep) if experiment else table
        rows = [
            {
                "run_id": r["run_id"],
                "run_name": r["run_name"],
                "arm": r["arm"],
                "seed": r.get("param:seed", "") if isinstance(r.get("param:seed", ""), str) else "",
            }
            for _, r in table.sort_values(["arm", "run_name"]).head(MAX_RUNS).iterrows()
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
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


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


def _with_prompts(samples: list[dict], suite: str) -> list[dict]:
    for s in samples:
        if s.get("prompt") is None and suite == "math":
            s["prompt"] = _math_prompt(s)
    return samples


# ---- the server ----------------------------------------------------------------------------------


class Viewer:
    """What the request handler serves: the runs' samples and the eval results. `discover()` -> (runs,
    problems, EvalSamples) finds them; a page load finds them again (REDISCOVER_S apart at most), so runs
    and checkpoints of a sweep still going show up, while indexes already built are kept."""

    def __init__(self, discover, uri: str | None = None) -> None:
        self._discover, self._found_at = discover, 0.0
        self._lock = threading.Lock()
        self.runs, self.evals, self.errors = RunSamples([], uri), None, []
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        with self._lock:
            if not force and time.monotonic() - self._found_at < REDISCOVER_S:
                return
            runs, errors, evals = self._discover()
            if self.evals is not None:
                evals._indexes = {k: v for k, v in self.evals._indexes.items() if k in evals.entries}
            self.runs.runs = {r["run_id"]: r for r in runs}
            self.evals, self.errors, self._found_at = evals, errors, time.monotonic()

    def api(self, path: str, q: dict[str, str]) -> dict:
        if path == "/api/index":
            self.refresh()
            return {
                "runs": [
                    {k: r[k] for k in ("run_id", "label", "arm", "seed", "link")}
                    for r in self.runs.runs.values()
                ],
                "evals": list(self.evals.entries.values()),
                "errors": self.errors + self.evals.errors,
            }
        run_ids = [r for r in q.get("runs", "").split(",") if r]
        kind = q.get("kind", "val")
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: use val or train")
        if path == "/api/prompts":
            prompts, errors = self.runs.prompts(run_ids, kind)
            return {"prompts": prompts, "errors": errors}
        if path == "/api/collapse":
            return self.runs.collapse(run_ids, kind, q.get("key", ""))
        if path == "/api/evals":
            idx = self.evals.index(q.get("eval", ""))
            page = idx.page(_filters(q), int(q.get("offset", 0)), int(q.get("limit", 50)))
            page["samples"] = _with_prompts(page["samples"], idx.suite)
            return page | {"datasets": idx.datasets(), "errors": idx.errors[:20]}
        if path == "/api/compare":
            a, b = self.evals.index(q.get("a", "")), self.evals.index(q.get("b", ""))
            out = compare(a, b, q.get("only", "changed"), int(q.get("offset", 0)), int(q.get("limit", 50)))
            for left, right in out["pairs"]:
                _with_prompts([left, right], a.suite)
            return out | {"errors": (a.errors + b.errors)[:20]}
        raise KeyError(f"no API {path}")


def _filters(q: dict[str, str]) -> Filters:
    def number(name: str) -> float | None:
        return float(q[name]) if q.get(name, "") != "" else None

    return Filters(
        wrong=q.get("wrong") == "1",
        unparsed=q.get("unparsed") == "1",
        score_min=number("score_min"),
        score_max=number("score_max"),
        dataset=q.get("dataset") or None,
    )


def make_handler(viewer: Viewer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urllib.parse.urlparse(self.path)
            if url.path in STATIC:
                path = PAGE_DIR / STATIC[url.path]
                self._send(200, path.read_bytes(), CONTENT_TYPES[path.suffix])
                return
            if not url.path.startswith("/api/"):
                self._send(404, b"not found", "text/plain")
                return
            q = dict(urllib.parse.parse_qsl(url.query))
            try:
                body, status = viewer.api(url.path, q), 200
            except (KeyError, ValueError, OSError) as exc:
                body, status = {"error": str(exc).strip("'\"").splitlines()[0][:300]}, 400
            self._send(status, json.dumps(body, default=str).encode(), "application/json")

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{ctype}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:  # quiet: one line per request is noise here
            pass

    return Handler


def serve(viewer: Viewer, port: int = DEFAULT_PORT) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 (loopback only: samples may hold anything the data held); port 0 = any."""
    return ThreadingHTTPServer(("127.0.0.1", port), make_handler(viewer))


def build_viewer(
    experiment: str | None = None,
    sweep: str | None = None,
    run_ids: list[str] | None = None,
    results_dir: Path = DEFAULT_RESULTS_DIR,
    checkpoints: list[str] | None = None,
    uri: str | None = None,
) -> Viewer:
    def discover() -> tuple[list[dict], list[str], EvalSamples]:
        return (*find_runs(experiment, sweep, run_ids, uri), EvalSamples(results_dir, checkpoints, uri))

    return Viewer(discover, uri)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.view", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", default=None, help="its runs (the newest sweep's unless --sweep)")
    p.add_argument("--sweep", default=None, help="a sweep id (tag rlpost.sweep): its runs")
    p.add_argument("--run", action="append", default=[], help="an MLflow run id (repeatable)")
    p.add_argument("--ckpt", action="append", default=[], help="an eval results folder name (repeatable)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="default: outputs/evals")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 = any free port"
    )
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    args = p.parse_args(argv)
    viewer = build_viewer(args.experiment, args.sweep, args.run, args.results_dir, args.ckpt)
    try:
        server = serve(viewer, args.port)
    except OSError as exc:
        print(
            f"error: cannot listen on 127.0.0.1:{args.port}: {exc.strerror} (pass --port 0)", file=sys.stderr
        )
        return 1
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(
        f"[view] {len(viewer.runs.runs)} runs, {len(viewer.evals.entries)} eval results; serving {url}",
        flush=True,
    )
    for line in viewer.errors + viewer.evals.errors:
        print(f"[view] {line}", flush=True)
    if not args.no_browser:
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
