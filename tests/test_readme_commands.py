"""README.md is the front door: every command it names runs, every link it gives leads somewhere, and it stays short.

The checks are pure functions of the README's text, so the test can also be pointed at another README (the
mutation check of issue 45 ran them on the 463-line README this one replaced: it fails the shape check).
`make` targets are only looked up in the Makefile, never run; `python -m` modules are run with `--help`.
"""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path

import pytest

from infra.models import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
MAX_LINES = 200
MAX_LINE_CHARS = 159  # "every line under 160 characters"
HELP_TIMEOUT_S = 60
USER_TARGETS = {
    "sweep",
    "sweep-status",
    "pipeline",
    "train",
    "report",
    "view",
    "leaderboard",
    "test",
    "test-all",
}
USER_MODULES = {
    "train",
    "evals.math",
    "evals.novelty",
    "evals.creative_writing",
    "evals.sycophancy",
    "evals.watch",
}


def _code(text: str) -> str:
    """The README's code: fenced blocks and inline code spans, where commands are written."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", prose))


def make_targets_named(text: str) -> set[str]:
    """Every TARGET of a `make TARGET` the text writes in code (patterns like `make bench-*` left out)."""
    return set(re.findall(r"(?<![\w-])make ([a-z][\w-]*)(?![\w*<-])", _code(text)))


def makefile_targets(makefile: str) -> set[str]:
    """The targets a Makefile defines (rule lines `name: ...`, not variable assignments `name := ...`)."""
    targets = set()
    for line in makefile.splitlines():
        match = re.match(r"^([\w][\w .-]*?)\s*:(?!=)", line)
        if match and not line.startswith("\t"):
            targets.update(name for name in match.group(1).split() if not name.startswith("."))
    return targets


def modules_named(text: str) -> set[str]:
    """Every module of a `python -m MODULE` the text writes in code (placeholders like `bench.<name>` left out)."""
    found = re.findall(r"python3? -m ([\w.]+)(\S*)", _code(text))
    return {name for name, rest in found if not name.endswith(".") and not rest.startswith(("<", "{"))}


def shape_problems(text: str) -> list[str]:
    """Why the text is not a front door: too many lines, or a line too long to read without scrolling."""
    lines = text.splitlines()
    problems = [f"{len(lines)} lines (at most {MAX_LINES})"] if len(lines) > MAX_LINES else []
    problems += [f"line {i}: {len(x)} characters" for i, x in enumerate(lines, 1) if len(x) > MAX_LINE_CHARS]
    return problems


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces to '-',
    a repeated anchor numbered -1, -2, ..."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", markdown, flags=re.S | re.M)
    anchors: set[str] = set()
    for title in re.findall(r"^#{1,6} +(.+?) *#*$", prose, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def broken_links(text: str, base: Path) -> list[str]:
    """Relative links (`[x](path#anchor)`) whose file does not exist under `base`, or whose anchor is not a
    heading of that Markdown file."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][\w+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (base / path) if path else None
        if file is not None and not file.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and (file is None or file.suffix == ".md"):
            headings = heading_anchors(file.read_text() if file else text)
            if anchor not in headings:
                broken.append(f"{target}: no heading with anchor #{anchor}")
    return broken


def help_failure(module: str) -> str | None:
    """Why `python -m module --help` does not work (None when it exits 0)."""
    try:
        spec = find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return f"{module}: not importable"
    if spec.origin and not Path(spec.origin).resolve().is_relative_to(PROJECT_ROOT.resolve()):
        return f"{module}: found outside this checkout, at {spec.origin} (a stale editable install?)"
    if spec.submodule_search_locations is not None and find_spec(f"{module}.__main__") is None:
        return f"{module}: a package without __main__"
    try:
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, timeout=HELP_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"{module} --help: no answer in {HELP_TIMEOUT_S} s"
    if done.returncode != 0:
        return f"{module} --help: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


# ---- the checkers on hand-written text --------------------------------------------------------------------


def test_the_checkers_on_hand_written_text(tmp_path):
    text = (
        "# Title\n\n## Quick start\n\n```bash\nmake sweep EXP=x  # main job\n```\n\n"
        "Run `make report EXP=x`, then `python -m evals.math --ckpt C` or `python -m bench.<name>` (`make bench-*`); "
        "to make sure, `python3 -m train.plan`.\n"
        "[a](docs/a.md#kept) [b](docs/a.md#gone) [c](missing.md) [d](https://x.org/y) [e](#quick-start) [f](#nope)\n"
    )  # fmt: skip
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Kept\n\n```\n## not a heading\n```\n")
    assert make_targets_named(text) == {"sweep", "report"}
    assert modules_named(text) == {"evals.math", "train.plan"}
    assert broken_links(text, tmp_path) == [
        "docs/a.md#gone: no heading with anchor #gone", "missing.md: no such file", "#nope: no heading with anchor #nope"
    ]  # fmt: skip
    assert heading_anchors("# Setup (GPU): a/b\n## x\n## x\n") == {"setup-gpu-ab", "x", "x-1"}
    assert makefile_targets("PY := x\nsweep: setup  ## s\n\t$(PY) -m y\n.PHONY: a b\nbench bench-train: setup\n") == {
        "sweep", "bench", "bench-train"
    }  # fmt: skip
    assert shape_problems("a\n" * 3) == []
    too_long = "x" * 160 + "\n" + "b\n" * 200
    assert shape_problems(too_long) == ["201 lines (at most 200)", "line 1: 160 characters"]


# ---- the README itself -------------------------------------------------------------------------------------


def test_readme_is_short_with_short_lines():
    assert shape_problems(README.read_text()) == []


def test_every_make_target_the_readme_names_is_in_the_makefile():
    named = make_targets_named(README.read_text())
    assert USER_TARGETS <= named
    missing = named - makefile_targets((PROJECT_ROOT / "Makefile").read_text())
    assert not missing, f"README names make targets the Makefile lacks: {sorted(missing)}"


def test_every_relative_link_in_the_readme_leads_somewhere():
    assert broken_links(README.read_text(), PROJECT_ROOT) == []


@pytest.mark.slow  # a dozen interpreters importing torch: several seconds on 2 cores
def test_every_module_the_readme_names_answers_help():
    modules = sorted(modules_named(README.read_text()))
    assert USER_MODULES <= set(modules)
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(help_failure, modules) if f]
    assert not failures, "\n".join(failures)


def test_every_relative_link_in_docs_leads_somewhere():
    """The documents the README sends readers to link on correctly (files moved in issue 45 among them)."""
    broken = [f"{doc.name}: {x}" for doc in sorted((PROJECT_ROOT / "docs").glob("*.md"))
              for x in broken_links(doc.read_text(), doc.parent)]  # fmt: skip
    assert not broken, "\n".join(broken)
