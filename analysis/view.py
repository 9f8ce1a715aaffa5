"""`python -m analysis.view` (`make view`): the samples behind the numbers, in a local browser page.

Four pages, one server (Python's http.server on 127.0.0.1 only; plain HTML/JS in analysis/view_page,
no network, no build step):

- collapse: one prompt across training steps, one column per run (arm): the group's answers at each
  logged step, coloured by partition class, from the runs' `samples/{val,train}/<step>.jsonl`
  artifacts (train/samples.py). Validation samples repeat the same held-out prompts at every
  validation, so they show one prompt's group narrowing (GRPO) or staying spread (DARLING);
- trajectories: one held-out prompt at the first and the last logged step (`/api/collapse?steps=ends`:
  step 0, before RL, and the end) side by side, a row per run, each answer's turns labelled model /
  tool / user (analysis/turns.py): what RL changed in how the model uses its tools;
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

from analysis.json_lines import json_safe
from analysis.sample_index import Filters, compare
from analysis.view_sources import EvalSamples, RunSamples, find_runs, with_prompts
from evals.common.cli import DEFAULT_RESULTS_DIR

PAGE_DIR = Path(__file__).with_name("view_page")
STATIC = {"/": "index.html", "/view.js": "view.js", "/view.css": "view.css"}
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
DEFAULT_PORT = 8765  # the report's links point here (analysis/report.py)
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
        f"{link('collapse', 'the collapse view', runs=paired, kind='val')}; "
        f"{link('trajectories', 'one held-out prompt at step 0 and at the end', runs=paired, kind='val')}.</p>"
        f'<table class="leaderboard samples-links"><thead><tr><th>arm</th><th colspan="3">its samples</th></tr>'
        f"</thead><tbody>{rows}</tbody></table>"
        f"<p class='meta'>Per metric: {' · '.join(per_metric)}</p>"
    )


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
            return self.runs.collapse(run_ids, kind, q.get("key", ""), q.get("steps", "all"))
        if path == "/api/evals":
            idx = self.evals.index(q.get("eval", ""))
            page = idx.page(_filters(q), int(q.get("offset", 0)), int(q.get("limit", 50)))
            page["samples"] = with_prompts(page["samples"], idx.suite)
            return page | {"datasets": idx.datasets(), "errors": idx.errors[:20]}
        if path == "/api/compare":
            a, b = self.evals.index(q.get("a", "")), self.evals.index(q.get("b", ""))
            out = compare(a, b, q.get("only", "changed"), int(q.get("offset", 0)), int(q.get("limit", 50)))
            for left, right in out["pairs"]:
                with_prompts([left, right], a.suite)
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


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip("'\"").splitlines() or [""])[0][:300]


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
                body, status = {"error": _one_line(exc)}, 400
            except Exception as exc:  # noqa: BLE001 - every request gets an answer, never a dropped connection
                body, status = {"error": f"{url.path}: {type(exc).__name__}: {_one_line(exc)}"}, 500
            self._send(status, json.dumps(json_safe(body), default=str).encode(), "application/json")

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
