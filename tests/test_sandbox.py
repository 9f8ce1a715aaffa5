"""The sandbox against hostile programs, under each mechanism (one skipped where it cannot run, e.g. bubblewrap
not installed, unshare without root): each gives one error result, returns within its limits, and leaves the
caller, the machine and other sandboxes untouched. What each mechanism isolates is measured one property per
test and must match ISOLATES (the table in docs/agents.md). Plus the python tool's messages and the choice of
mechanism (its one log line, the refusal to fall back to process limits alone)."""

import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
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
# What each mechanism keeps from the program (True: isolated), as the tests below measure it
ISOLATES = {
    "bwrap": {"files": True, "cmdlines": True, "loopback": True, "disk": True, "environ": True},
    "unshare": {"files": True, "cmdlines": True, "loopback": True, "disk": True, "environ": True},
    "rlimits": {"files": False, "cmdlines": False, "loopback": False, "disk": False, "environ": ROOT},
}


@pytest.fixture(params=["bwrap", "unshare", "rlimits"])
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
    # it did fork, but no further than max_procs (+ bubblewrap's own two processes, or unshare's launcher and init)
    assert 3 <= peak[0] <= FAST.max_procs + (0 if mechanism == "rlimits" else 2)
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


def test_reads_the_trainers_environment(mechanism, monkeypatch):
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLPOST_FAKE_API_KEY", secret)
    holder = subprocess.Popen(["sleep", "30"], env={"RLPOST_FAKE_API_KEY": secret})  # a process with the key
    program = f"""
import json, os
print(json.dumps(sorted(os.environ)))
for pid in ['{os.getpid()}', *os.listdir('/proc')]:
    try:
        print(pid, open(f'/proc/{{pid}}/environ', 'rb').read())
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
    assert (secret not in result.stdout + result.stderr) == ISOLATES[mechanism]["environ"]


def test_reads_a_world_readable_file_outside_its_folder(mechanism):
    folder = tempfile.mkdtemp()
    paths = [os.path.join(folder, "notes.txt"), f"/var/tmp/rlpost-probe-{uuid.uuid4().hex}"]
    try:
        os.chmod(folder, 0o755)
        for path in paths:
            with open(path, "w") as f:
                f.write("the trainer's")
            os.chmod(path, 0o644)
        probe = [*paths, os.path.join(REPO, "pyproject.toml")]
        program = f"for path in {probe!r}:\n    try:\n        open(path).read(1)\n        print(path)\n"
        result = sandbox.run(program + "    except OSError:\n        pass\n", FAST, mechanism)
    finally:
        for path in paths:
            os.unlink(path)
        os.rmdir(folder)
    assert result.ok, result.stderr
    read = result.stdout.split()
    assert (read == []) == ISOLATES[mechanism]["files"], read
    if not ISOLATES[mechanism]["files"]:
        assert paths[0] in read  # a world-readable file in the shared /tmp


def test_lists_other_processes_command_lines(mechanism):
    marker = uuid.uuid4().hex
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    program = f"""
import os
seen = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        seen.append(open(f'/proc/{{pid}}/cmdline', 'rb').read())
    except OSError:
        pass
print(len(seen), any(b'{marker}' in cmdline for cmdline in seen))
"""
    try:
        result = sandbox.run(program, FAST, mechanism)
    finally:
        holder.kill()
        holder.wait()
    assert result.ok, result.stderr
    count, found = result.stdout.split()
    assert (found == "False") == ISOLATES[mechanism]["cmdlines"], count
    if ISOLATES[mechanism]["cmdlines"]:
        assert count == "2"  # its pid namespace's init and itself


def test_connects_to_a_loopback_listener(mechanism):
    accepted = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.05)
        stop = threading.Event()

        def answer():
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    accepted.append(True)
                    conn.sendall(b"hello")

        thread = threading.Thread(target=answer)
        thread.start()
        port = server.getsockname()[1]
        program = f"""
import socket
try:
    with socket.create_connection(('127.0.0.1', {port}), timeout=1) as conn:
        print(conn.recv(5).decode())
except OSError as exc:
    print('unreachable', exc.errno)
"""
        try:
            result = sandbox.run(program, FAST, mechanism)
        finally:
            stop.set()
            thread.join()
    assert result.ok, result.stderr
    reached = result.stdout.strip() == "hello"
    assert reached == bool(accepted) and reached != ISOLATES[mechanism]["loopback"], result.stdout


def test_writes_past_disk_mb(mechanism):
    limits = sandbox.Limits(wall_s=10, cpu_s=5, disk_mb=8, file_mb=4)
    prefix = f"rlpost-fill-{uuid.uuid4().hex}"
    program = f"""
import os
for folder in ('.', '/tmp', '/dev/shm'):
    mb = 0
    for i in range(4):  # 16 MB in files of 4 MB (file_mb), twice disk_mb
        try:
            with open(os.path.join(folder, '{prefix}-' + str(i)), 'wb') as f:
                f.write(bytes(4 << 20))
            mb += 4
        except OSError:
            break
    print(folder, mb)
"""
    try:
        result = sandbox.run(program, limits, mechanism)
    finally:
        for path in glob.glob(f"/tmp/{prefix}-*") + glob.glob(f"/dev/shm/{prefix}-*"):
            os.unlink(path)  # left by rlimits without root (as root its files are swept)
    assert result.ok, result.stderr
    written = {line.split()[0]: int(line.split()[1]) for line in result.stdout.splitlines()}
    capped = all(mb <= limits.disk_mb for mb in written.values())
    expected = ISOLATES[mechanism]["disk"] and sandbox.choose(mechanism).sized_tmpfs  # bwrap < 0.8: no --size
    assert capped == expected, written
    if mechanism == "unshare":
        assert sum(written.values()) <= limits.disk_mb  # one cap for all three


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
        assert not os.path.exists(path)  # rlimits: a /tmp write lands and is swept; unshare: a private /tmp
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
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on PATH: auto takes unshare, or refuses
    try:
        first = sandbox.choose("auto")
    except RuntimeError as exc:  # unshare not usable either (this caller is not root, or lacks CAP_SYS_ADMIN)
        assert str(exc).startswith(
            "sandbox: nothing here isolates the python tool (bwrap not found; unshare "
        )
        assert "opt in to process limits alone with the tool's mechanism=rlimits" in str(exc)
        assert capsys.readouterr().err == ""
    else:
        assert ROOT and sandbox.choose("auto") is first and first.name == "unshare"
        line = f"sandbox: namespaces by unshare(2) (bwrap not found; python {first.python}, uids 64000+)"
        assert capsys.readouterr().err.splitlines() == [line]
    opted = sandbox.choose("rlimits")  # the opt-in says what it leaves open
    assert capsys.readouterr().err.startswith(
        "sandbox: process limits alone (mechanism=rlimits: the network, world-readable files and other "
        f"processes stay reachable, disk is unbounded; python {opted.python}"
    )
    with pytest.raises(RuntimeError, match="bwrap: not usable here \\(not found\\); install bubblewrap"):
        sandbox.choose("bwrap")
    with pytest.raises(ValueError, match="expected one of auto, bwrap, unshare, rlimits"):
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
from train.env.tools.python import PythonTool
bomb = "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass\\n"
escape = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(30)\\nprint('parent done')"
out = {}
for mechanism in ("bwrap", "unshare", "rlimits"):
    try:
        sandbox.choose(mechanism)
    except RuntimeError as exc:
        out[mechanism] = str(exc)
        continue
    limits = sandbox.Limits(wall_s=1, cpu_s=1, max_procs=8)
    runs = [sandbox.run(src, limits, mechanism) for src in (bomb, escape, "print('x' * 10**7)")]
    out[mechanism] = [[r.killed, r.reason, len(r.stdout)] for r in runs]
    caller = sandbox.run(f"print(open('/proc/{os.getpid()}/environ').read())", limits, mechanism).stdout
    out[mechanism].append(os.environ["RLPOST_FAKE_API_KEY"] in caller)  # this caller's environment read
os.environ["PATH"] = "/nonexistent"  # no bwrap, and no root for unshare: the tool refuses at its start
sandbox._chosen.clear()
try:
    PythonTool()
except RuntimeError as exc:
    out["auto"] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT, reason="runs the caller as an unprivileged uid, which needs root")
def test_unprivileged_caller():
    """The paths a caller without root takes (own uid, session and namespace kill; unshare refused, auto refusing
    without bwrap), run as a uid of no one."""
    uid = sandbox.UID_BASE + sandbox.UID_SLOTS + 1
    python = "/usr/bin/python3"
    done = subprocess.run(
        [python, "-I", "-c", UNPRIVILEGED, REPO], user=uid, group=uid, extra_groups=[],
        env={"RLPOST_FAKE_API_KEY": f"sk-test-{uuid.uuid4().hex}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if "ModuleNotFoundError" in done.stderr or "PermissionError" in done.stderr:
        pytest.skip(f"uid {uid} cannot import the repository from {REPO}: {done.stderr.splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert isinstance(results["rlimits"], list)
    assert (
        results["unshare"]
        == "sandbox mechanism=unshare: not usable here (needs root); run as root (with CAP_SYS_ADMIN)"
    )
    assert results.pop("auto").startswith(
        "sandbox: nothing here isolates the python tool (bwrap not found; unshare needs root): install bubblewrap"
    )
    for mechanism, runs in results.items():
        if isinstance(runs, str):
            continue  # bwrap not usable here, unshare not as this uid
        expected = [
            [True, "wall time 1 s exceeded", 0],
            [False, "", 12],
            [True, "output over 65536 bytes", 65536],
            mechanism == "rlimits",  # the caller's environment: rlimits runs as the caller's own uid
        ]
        assert runs == expected, mechanism
    deadline = time.monotonic() + 2  # a pid namespace is torn down by the kernel, a moment after its end
    while sandbox._live_pids(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox._live_pids(uid) == []  # the bomb and the setsid() child are gone too
