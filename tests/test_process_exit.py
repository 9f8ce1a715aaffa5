"""infra.process_exit: the way every entry point and torchrun worker ends (a rank of a 2-rank gloo test aborted in
the interpreter's teardown after its results were written)."""

import os
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
    entry_points = {PROJECT_ROOT / "train" / "__main__.py", PROJECT_ROOT / "orchestration" / "pipeline.py"}
    entry_points.add(PROJECT_ROOT / "train" / "stages" / "grpo.py")
    scripts = [
        *PROJECT_ROOT.glob("train/**/*.py"),
        *PROJECT_ROOT.glob("orchestration/*.py"),
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


PYTEST_CASE = """
import atexit

import torch.distributed as dist

from train.policy.distributed import init_distributed

atexit.register(lambda: print("TEARDOWN", flush=True))


def test_joins_a_group():
    if JOIN:
        init_distributed()
    assert dist.is_initialized() == JOIN


def test_outcome():
    assert OUTCOME
"""


def test_a_pytest_run_that_joined_a_group_ends_with_pytests_status_after_its_report(tmp_path):
    """tests/conftest.py ends such a run through exit_now once pytest has reported: the summary line is
    printed, the exit status is pytest's (0 all passed, 1 a failure), and no teardown runs (the atexit line
    is missing); a run that joined no group ends as usual."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    cases = [
        (True, True, 0, "2 passed"),
        (True, False, 1, "1 failed, 1 passed"),
        (False, True, 0, "2 passed"),
    ]
    for i, (join, outcome, status, summary) in enumerate(cases):
        case = tmp_path / f"case{i}" / "test_case.py"
        case.parent.mkdir()
        case.write_text(PYTEST_CASE.replace("JOIN", str(join)).replace("OUTCOME", str(outcome)))
        cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "tests.conftest", "--rootdir", str(case.parent),
               "-p", "no:cacheprovider", str(case)]  # fmt: skip
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
        lines = proc.stdout.splitlines()
        assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert summary in (lines[-2] if not join else lines[-1])
        assert ("TEARDOWN" in lines) == (not join)  # the teardown ran only where no group was joined
