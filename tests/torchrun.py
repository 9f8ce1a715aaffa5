"""Run a worker script of tests/ under torchrun on this machine: `world` gloo ranks, one thread each."""

from __future__ import annotations

import os
import subprocess
import sys

from infra.models import PROJECT_ROOT


def run_worker(script: str, world: int, *args: str, timeout: int = 300) -> None:
    """Start `tests/<script>` with `args` on `world` ranks; fail the test with its stderr if a rank fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           str(PROJECT_ROOT / "tests" / script), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # this process's own rendezvous (tests/conftest.py's dist_group) is not theirs
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
