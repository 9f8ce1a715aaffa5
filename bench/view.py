"""Benchmark: the samples viewer on a large eval (default 10,000 samples of ~1 KB each).

`python -m bench.view [--samples 10000] [--chars 1000] [--chromium PATH]` (`make bench-view`) writes a
synthetic math `samples.jsonl`, serves it with analysis.view on a free loopback port and measures:
the index build (the first page request), a filtered page request (wrong only, one dataset, page 40), and
in headless Chromium the time from navigation to the first rendered page of samples, cold (index not yet
built) and warm, with the bytes the page fetched against the file's size (the peer: a page that loads
the whole eval). Prints the machine's load with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def _get(url: str) -> tuple[dict, float]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as r:
        body = json.loads(r.read())
    return body, time.perf_counter() - t


def _first_render(browser, url: str) -> tuple[float, int]:
    """ms from navigation to the first rendered eval page, and the bytes the page fetched."""
    browser.goto("about:blank")
    browser.wait_for("document.readyState === 'complete'")
    browser.goto(url)
    browser.wait_rendered("evals", timeout=300)
    ms = browser.eval("window.rlpostFirstRender")
    fetched = browser.eval(
        "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
        ".reduce((n, e) => n + (e.encodedBodySize || 0), 0)"
    )
    return float(ms), int(fetched)


def main(argv: list[str] | None = None) -> None:
    from analysis.view import build_viewer, serve
    from tests.cdp_browser import Browser
    from tests.view_data import write_eval

    p = argparse.ArgumentParser(prog="python -m bench.view", description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--chars", type=int, default=1000, help="response length (characters, at most)")
    p.add_argument("--chromium", default=shutil.which("chromium"), help="default: chromium on PATH")
    args = p.parse_args(argv)

    def load() -> str:
        one, five, fifteen = os.getloadavg()
        return f"load {one:.1f}/{five:.1f}/{fifteen:.1f} on {os.cpu_count()} cores"

    with tempfile.TemporaryDirectory(prefix="rlpost-view-bench-") as tmp:
        root = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
        t = time.perf_counter()
        path = write_eval(root / "evals", "big-step_100", args.samples, text_chars=args.chars)
        size = path.stat().st_size
        print(
            f"[bench-view] wrote {args.samples} samples, {size / 1e6:.1f} MB in {time.perf_counter() - t:.1f} s"
        )
        viewer = build_viewer(results_dir=root / "evals")
        server = serve(viewer, port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        key = "big-step_100%2Fmath"
        try:
            if args.chromium:
                browser = Browser(args.chromium, root / "profile")
                try:
                    cold, fetched = _first_render(browser, f"{base}/#evals?eval={key}")
                    warm, _ = _first_render(browser, f"{base}/#evals?eval={key}&wrong=1")
                finally:
                    browser.close()
                print(
                    f"[bench-view] first render in Chromium: cold (index built) {cold:.0f} ms, warm {warm:.0f} ms; "
                    f"page fetched {fetched / 1e3:.0f} kB of a {size / 1e6:.1f} MB eval "
                    f"({fetched / size:.2%} of loading it whole) | {load()}"
                )
            else:
                print("[bench-view] no chromium on PATH (apt-get install chromium): browser figures skipped")
            viewer.evals._indexes.clear()  # the index build alone, through the API
            first, build_s = _get(f"{base}/api/evals?eval={key}&limit=25")
            page, page_s = _get(f"{base}/api/evals?eval={key}&wrong=1&dataset=gsm8k&offset=1000&limit=25")
            print(
                f"[bench-view] API: index of {first['total']} samples built in {build_s * 1e3:.0f} ms (first request); "
                f"a filtered page ({page['matched']} match, 25 from 1000) in {page_s * 1e3:.0f} ms | {load()}"
            )
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
