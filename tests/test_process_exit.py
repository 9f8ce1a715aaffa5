"""infra.process_exit: the way every entry point and torchrun worker ends (a rank of a 2-rank gloo test aborted in
the interpreter's teardown after its results were written)."""

import subprocess
import sys
from pathlib import Path

from infra.models import PROJECT_ROOT

SCRIPT = """
import atexit
from infra.process_exit import exit_now
atexit.register(lambda: print("TEARDOWN", flush=True))
print("buffered on stdout", end="")
sys.stderr.write("buffered on stderr")
exit_now(CODE)
print("never")
"""


def _run(code: int) -> subprocess.CompletedProcess:
    src = "import sys\n" + SCRIPT.replace("CODE", str(code))
    env = {"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"}
    # stdout and stderr are pipes: block-buffered, so nothing reaches them unless exit_now flushes
    return subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=60)


def test_exit_now_flushes_both_streams_returns_the_code_and_skips_the_teardown():
    proc = _run(3)
    assert proc.returncode == 3
    assert proc.stdout == "buffered on stdout"  # flushed; no atexit handler ran, nothing after the call
    assert proc.stderr == "buffered on stderr"
    assert _run(0).returncode == 0


def test_every_torchrun_worker_and_entry_point_ends_through_exit_now():
    """A process that returns into the teardown can abort after its work succeeded: each entry point of the
    trainer, and every script that joins a process group itself, must end with exit_now."""
    entry_points = {PROJECT_ROOT / "train" / name for name in ("__main__.py", "pipeline.py")}
    entry_points.add(PROJECT_ROOT / "train" / "stages" / "grpo.py")
    scripts = [
        *PROJECT_ROOT.glob("train/**/*.py"),
        *PROJECT_ROOT.glob("bench/*.py"),
        *PROJECT_ROOT.glob("tests/*.py"),
    ]
    here = Path(__file__).resolve()
    joins = [
        p
        for p in scripts
        if p.resolve() != here
        and ("init_distributed()" in p.read_text() or "init_process_group(" in p.read_text())
    ]
    ends = sorted(entry_points | {p for p in joins if '__name__ == "__main__"' in p.read_text()})
    assert len(ends) >= 12, [str(p) for p in ends]  # the scan finds the workers and benches it is meant to
    missing = []
    for path in ends:
        main_block = path.read_text().split('if __name__ == "__main__":')[-1]
        if "exit_now(" not in main_block:
            missing.append(str(path.relative_to(PROJECT_ROOT)))
    assert not missing, f"end these with infra.process_exit.exit_now: {missing}"
