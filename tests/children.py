"""Python children of the multi-process tests (sweep drivers, MLflow writers and readers): started in the
project root with their stdout and stderr captured as text, read back with `communicate`."""

from __future__ import annotations

import subprocess
import sys

from infra.models import PROJECT_ROOT


def python_child(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`python *args` (a `-c` script or `-m` module and its arguments) with `env`, output captured."""
    return subprocess.Popen(
        [sys.executable, *args],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
