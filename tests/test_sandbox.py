"""The sandbox against hostile programs, under each mechanism (bubblewrap skipped where it cannot run): each
gives one error result, returns within its limits, and leaves the caller, the machine and other sandboxes
untouched. Plus the python tool's messages and the mechanism's one log line."""

import json
import os
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from train.env import sandbox
from train.env.base import ToolError
from train.env.tools.python import PythonTool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.geteuid() == 0
FAST = sandbox.Limits(wall_s=2, cpu_s=1, memory_mb=256, max_procs=8)


@pytest.fixture(params=["bwrap", "rlimits"])
def mechanism(request):
    try:
        sandbox.choose(request.param)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return request.param


def sandbox_processes() -> list[int]:
    """Processes running a sandboxed program (their command line names its working folder's main.py)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError):
            continue
        if name.isdigit() and b"/rlpost-sandbox-" in cmdline and b"main.py" in cmdline and alive(name):
            found.append(int(name))
    return found


def alive(pid: str) -> bool:
    """Not a zombie (dead, waiting to be reaped) and not gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_runs_a_program(mechanism):
    result = sandbox.run(
        "import sys; print(6 * 7); print('note', file=sys.stderr); sys.exit(3)", FAST, mechanism
    )
    assert (result.stdout, result.stderr, result.exit_code, result.killed) == ("42\n", "note\n", 3, False)
    assert result.reason == "exit status 3" and not result.ok
    assert sandbox.run("print('ok')", FAST, mechanism).ok


def test_fork_bomb_is_capped_and_leaves_nothing(mechanism):
    assert sandbox_processes() == []
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], len(sandbox_processes()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    try:
        result = sandbox.run(bomb, FAST, mechanism)
    finally:
        done.set()
        watcher.join()
    assert result.killed and result.reason == "wall time 2 s exceeded"
    assert time.monotonic() - start < FAST.wall_s + 2
    # it did fork, but no further than max_procs (+ bubblewrap's own two processes)
    assert 3 <= peak[0] <= FAST.max_procs + (2 if mechanism == "bwrap" else 0)
    assert sandbox_processes() == []  # nothing of it survives


def test_endless_loop_is_killed(mechanism):
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass\n", FAST, mechanism)
    assert result.killed and result.exit_code in (None, -24)
    assert result.reason in ("cpu time 1 s exceeded", "wall time 2 s exceeded")
    assert time.monotonic() - start < FAST.wall_s + 1.5
    slept = sandbox.run(
        "import time\nprint('before', flush=True)\ntime.sleep(60)", sandbox.Limits(wall_s=1), mechanism
    )
    assert (slept.killed, slept.reason, slept.stdout) == (True, "wall time 1 s exceeded", "before\n")


def test_huge_allocation_fails_in_the_program_only(mechanism):
    before = rss_kb()
    result = sandbox.run("x = bytearray(10 * 1024 ** 3)\nprint('allocated')", FAST, mechanism)
    assert not result.ok and "allocated" not in result.stdout
    assert "MemoryError" in result.stderr and "256 MB memory limit" in result.reason
    growing = (
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 * 1024 ** 2))"  # touched, 10 MB at a time
    )
    grow = sandbox.run(growing, sandbox.Limits(wall_s=10, memory_mb=128), mechanism)
    assert "128 MB memory limit" in grow.reason and "MemoryError" in grow.stderr
    assert rss_kb() - before < 50 * 1024  # the caller's memory did not grow with it


def test_printing_100_mb_is_cut_and_returns_quickly(mechanism):
    limits = sandbox.Limits(wall_s=20, max_output_bytes=65536)
    start = time.monotonic()
    result = sandbox.run(
        "import sys\nfor _ in range(100_000):\n    sys.stdout.write('x' * 999 + '\\n')", limits, mechanism
    )
    assert time.monotonic() - start < 5  # cut at the cap, not at the wall limit
    assert result.killed and result.reason == "output over 65536 bytes"
    assert len(result.stdout.encode()) == 65536 and set(result.stdout) == {"x", "\n"}
    big = sandbox.run("print('y' * 100_000_000)", limits, mechanism)
    assert big.killed and len(big.stdout) == 65536


def test_environment_and_secrets_are_invisible(mechanism, monkeypatch):
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLPOST_FAKE_API_KEY", secret)
    holder = subprocess.Popen(["sleep", "30"], env={"RLPOST_FAKE_API_KEY": secret})  # a process with the key
    program = """
import json, os
print(json.dumps(sorted(os.environ)))
for pid in os.listdir('/proc'):
    try:
        print(pid, open(f'/proc/{pid}/environ', 'rb').read())
    except (OSError, ValueError) as exc:
        pass
"""
    try:
        result = sandbox.run(program, FAST, mechanism)
    finally:
        holder.kill()
        holder.wait()
    assert result.ok, result.stderr
    names = json.loads(result.stdout.splitlines()[0])
    assert set(names) <= {"PWD", "LC_CTYPE"}  # bwrap's --chdir sets PWD, Python its C.UTF-8 locale
    if mechanism == "rlimits" and not ROOT:
        pytest.skip("process limits without root: /proc/<pid>/environ of the same uid stays readable")
    assert secret not in result.stdout + result.stderr


def test_writes_outside_the_working_folder_do_not_land(mechanism):
    outside = [f"/tmp/x-{uuid.uuid4().hex}", os.path.join(REPO, f"x-{uuid.uuid4().hex}")]
    program = f"""
import os
print(os.getcwd())
with open('inside.txt', 'w') as f:
    f.write('mine')
print('inside', open('inside.txt').read())
for path in {outside!r}:
    try:
        with open(path, 'w') as f:
            f.write('escaped')
        print('wrote', path)
    except OSError as exc:
        print('refused', path, exc.errno)
"""
    if mechanism == "rlimits" and not ROOT:
        pytest.skip("process limits without root: the program may write wherever this user can")
    result = sandbox.run(program, FAST, mechanism)
    lines = result.stdout.splitlines()
    assert result.ok and lines[1] == "inside mine", result.stderr
    assert f"refused {outside[1]}" in result.stdout  # the repository: read-only or not this uid's
    if mechanism == "bwrap":
        assert f"refused {outside[0]}" in result.stdout  # /tmp is read-only inside
    for path in outside:
        assert not os.path.exists(path)  # under rlimits a /tmp write lands, and is swept afterwards
    assert not os.path.exists(lines[0])  # the working folder is gone


def test_concurrent_sandboxes_do_not_interfere(mechanism):
    program = """
import json, os, time
open('mine-{i}', 'w').close()
time.sleep(0.5)
print(json.dumps([{i}, sorted(os.listdir('.')), os.getuid()]))
"""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    limits = sandbox.Limits(wall_s=4, cpu_s=4, max_procs=8)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=5) as pool:
        hostile = pool.submit(sandbox.run, bomb, sandbox.Limits(wall_s=1.5, max_procs=8), mechanism)
        results = list(pool.map(lambda i: sandbox.run(program.format(i=i), limits, mechanism), range(4)))
        assert hostile.result().killed
    assert time.monotonic() - start < 4  # in parallel, not one after another
    uids = set()
    for i, result in enumerate(results):
        assert result.ok, result.stderr
        number, listing, uid = json.loads(result.stdout)
        assert number == i and listing == ["main.py", f"mine-{i}"]  # its own folder only
        uids.add(uid)
    if ROOT:
        assert len(uids) == 4  # one uid per running sandbox
    assert sandbox_processes() == []


def test_mechanism_is_chosen_once_and_logged(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_chosen", {})
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on PATH: auto falls back, bwrap refuses
    first = sandbox.choose("auto")
    assert sandbox.choose("auto") is first and first.name == "rlimits"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandbox: process limits (bwrap not found")
    with pytest.raises(RuntimeError, match="bwrap: not usable here \\(not found\\)"):
        sandbox.choose("bwrap")
    with pytest.raises(ValueError, match="expected one of auto, bwrap, rlimits"):
        sandbox.choose("docker")
    with pytest.raises(ValueError, match="wall_s=0"):
        sandbox.Limits(wall_s=0)


def test_python_tool_messages(mechanism):
    tool, slow = PythonTool(timeout_s=5, mechanism=mechanism), PythonTool(timeout_s=1, mechanism=mechanism)
    assert tool(code="print(2 ** 100)") == "1267650600228229401496703205376\n"
    assert (
        tool(code="import sys\nprint(1, end='')\nprint('careful', file=sys.stderr)")
        == "1\nstderr:\ncareful\n"
    )
    assert tool(code="x = 1") == "(no output: print() what you want to see)"
    with pytest.raises(ToolError, match="(?s)^error: exit status 1\nstderr:\nTraceback.*ZeroDivisionError"):
        tool(code="1 / 0")
    with pytest.raises(ToolError, match="^killed: wall time 1 s exceeded\nstarted\n$"):
        slow(code="import time\nprint('started')\ntime.sleep(30)")
    with pytest.raises(ToolError, match="missing"):
        tool()
    with pytest.raises(ToolError, match="unexpected argument"):
        tool(code="1", timeout=9)
    function = tool.schema()["function"]
    assert function["name"] == "python" and function["parameters"]["required"] == ["code"]
    with pytest.raises(ValueError, match="mechanism='docker'"):
        PythonTool(mechanism="docker")


UNPRIVILEGED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from train.env import sandbox
bomb = "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass\\n"
escape = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(30)\\nprint('parent done')"
out = {}
for mechanism in ("bwrap", "rlimits"):
    try:
        sandbox.choose(mechanism)
    except RuntimeError as exc:
        out[mechanism] = str(exc)
        continue
    limits = sandbox.Limits(wall_s=1, cpu_s=1, max_procs=8)
    runs = [sandbox.run(src, limits, mechanism) for src in (bomb, escape, "print('x' * 10**7)")]
    out[mechanism] = [[r.killed, r.reason, len(r.stdout)] for r in runs]
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT, reason="runs the caller as an unprivileged uid, which needs root")
def test_unprivileged_caller():
    """The paths a caller without root takes (own uid, session and namespace kill), run as a uid of no one."""
    uid = sandbox.UID_BASE + sandbox.UID_SLOTS + 1
    python = "/usr/bin/python3"
    done = subprocess.run(
        [python, "-I", "-c", UNPRIVILEGED, REPO], user=uid, group=uid, extra_groups=[], env={},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if "ModuleNotFoundError" in done.stderr or "PermissionError" in done.stderr:
        pytest.skip(f"uid {uid} cannot import the repository from {REPO}: {done.stderr.splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert isinstance(results["rlimits"], list)
    for mechanism, runs in results.items():
        if isinstance(runs, str):
            continue  # bwrap not usable here
        expected = [
            [True, "wall time 1 s exceeded", 0],
            [False, "", 12],
            [True, "output over 65536 bytes", 65536],
        ]
        assert runs == expected, mechanism
    deadline = time.monotonic() + 2  # a pid namespace is torn down by the kernel, a moment after its end
    while sandbox._live_pids(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox._live_pids(uid) == []  # the bomb and the setsid() child are gone too
