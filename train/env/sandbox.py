"""Run untrusted Python source in a separate, limited process (the `python` tool's sandbox).

Why: code a model wrote must not read the trainer's secrets (API keys in its environment), write outside a
scratch folder, outlive its call, or take the machine down (fork bomb, endless loop, 10 GB allocation, 100 MB
of output). Two mechanisms, chosen once per process (`mechanism="auto"`) and logged in one line:

- `bwrap` (bubblewrap, Debian package `bubblewrap`): new user, pid, network, ipc and uts namespaces, the whole
  file system read-only (/tmp too: an empty one), the working folder and /dev/shm private sized tmpfs, no
  network, no new privileges; the pid namespace dies with its first process, so nothing outlives the call.
- `rlimits` (bwrap missing or not usable): the same resource limits, empty environment and working folder,
  no new privileges. As root the program runs as a dedicated uid, so RLIMIT_NPROC holds, the trainer's files
  and /proc/<pid>/environ are unreadable and it can write only to world-writable folders, which are swept of
  that uid's files afterwards. Not root: its own uid with RLIMIT_NPROC at its current process count plus a
  margin, and at the end its session and every process still running its file killed (a child that starts
  a new session and then runs another program escapes this weakest mode, which also cannot stop writes
  wherever the user may write). The network stays reachable in both `rlimits` cases.

Both: rlimits on CPU seconds, address space, processes, file size and open files; an empty environment; a fresh
working folder removed afterwards; stdout and stderr read up to a byte cap each (past it the program is
killed, never buffered); a wall-clock limit; the whole process tree killed at the end. As root each sandbox
holds its own uid from a pool of uids without an account (UID_BASE.., a file lock per uid, so concurrent
sandboxes in any process never share one): limits, the final kill(-1) run as that uid, and the sweep touch
that sandbox only. The program's Python is the trainer's when the sandbox uid can run it, else /usr/bin/python3
(the trainer's venv may live under a folder only root can enter): the standard library is always there.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

MECHANISMS = ("auto", "bwrap", "rlimits")
UID_BASE, UID_SLOTS = 64000, 64  # uids with no account: each running sandbox holds one (as root)
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # swept of a sandbox uid's files (rlimits)
LOCK_DIRS = ("/run/rlpost-sandbox-uids", os.path.join(tempfile.gettempdir(), "rlpost-sandbox-uids"))

# Runs first inside the sandbox (already as its uid): lowers the limits, then executes the program's file in a
# fresh interpreter (-E -s: no PYTHON* variables, no user site; -u: what was printed before a kill is kept).
LAUNCHER = r"""
import ctypes, os, resource as r, sys
ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid programs gain nothing
cpu, mem, nproc, fsize, nofile = map(int, sys.argv[1:6])
for res, soft, hard in ((r.RLIMIT_CPU, cpu, cpu + 1), (r.RLIMIT_AS, mem, mem), (r.RLIMIT_NPROC, nproc, nproc),
                        (r.RLIMIT_FSIZE, fsize, fsize), (r.RLIMIT_NOFILE, nofile, nofile), (r.RLIMIT_CORE, 0, 0)):
    top = r.getrlimit(res)[1]
    r.setrlimit(res, (soft, hard) if top == r.RLIM_INFINITY else (min(soft, top), min(hard, top)))
os.execv(sys.executable, [sys.executable, "-E", "-s", "-u", sys.argv[6]])
"""


@dataclass(frozen=True)
class Limits:
    """What one program may use. `disk_mb` sizes the working folder and /dev/shm under bwrap; `rlimits` bounds
    each file by `file_mb` only. `max_procs` counts the program's own processes, the first one included (under
    `rlimits` also its uid's dead processes not yet reaped, as RLIMIT_NPROC does)."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_procs: int = 16
    file_mb: int = 16
    disk_mb: int = 64
    open_files: int = 64
    max_output_bytes: int = 65536

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"sandbox limit {name}={value!r}: expected a positive number")


@dataclass(frozen=True)
class Result:
    """A finished program. `exit_code`: its status, negative for a signal (bwrap's 128+n reads as -n), None
    when the sandbox killed it. `reason`: why it did not exit 0 ("" when it did), e.g. "wall time 5 s exceeded"."""

    stdout: str
    stderr: str
    exit_code: int | None
    killed: bool
    reason: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.killed


@dataclass(frozen=True)
class Mechanism:
    name: str  # "bwrap" | "rlimits"
    python: str
    bwrap: str | None = None
    sized_tmpfs: bool = True

    def command(self, workdir: str, limits: Limits, nproc: int) -> list[str]:
        mb = 1 << 20
        main = os.path.join(workdir, "main.py")
        numbers = (limits.cpu_s, limits.memory_mb * mb, nproc, limits.file_mb * mb, limits.open_files)
        inner = [self.python, "-I", "-S", "-c", LAUNCHER, *map(str, numbers), main]
        if self.name != "bwrap":
            return inner
        size = ["--size", str(limits.disk_mb * mb)] if self.sized_tmpfs else []
        return [
            *(self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"),
            *("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"),
            *size, *("--tmpfs", "/dev/shm", "--tmpfs", "/tmp"), *size, *("--tmpfs", workdir),
            *("--ro-bind", main, main, "--remount-ro", "/tmp", "--chdir", workdir, "--"), *inner,
        ]  # fmt: skip


def run(source: str, limits: Limits | None = None, mechanism: str = "auto") -> Result:
    """Run `source` as a Python program under `limits`; never raises for anything the program does."""
    limits = limits or Limits()
    return _run(source, limits, choose(mechanism))


_chosen: dict[str, Mechanism] = {}
_choose_lock = threading.Lock()


def choose(requested: str = "auto") -> Mechanism:
    """The mechanism for `requested` (decided once per process, logged once). A `bwrap` that cannot run here
    is a RuntimeError naming why; `auto` then falls back to `rlimits`."""
    if requested not in MECHANISMS:
        raise ValueError(f"sandbox mechanism={requested!r}: expected one of {', '.join(MECHANISMS)}")
    with _choose_lock:
        if requested not in _chosen:
            mech, why = (
                _probe_bwrap() if requested != "rlimits" else (None, "not requested: mechanism=rlimits")
            )
            if mech is None and requested == "bwrap":
                raise RuntimeError(
                    f"sandbox mechanism=bwrap: not usable here ({why}); install bubblewrap or use rlimits"
                )
            if mech is not None:
                line = f"sandbox: bubblewrap {mech.bwrap} (python {mech.python}{_uid_note()})"
            else:
                mech = _probe_rlimits()
                line = f"sandbox: process limits (bwrap {why}; python {mech.python}{_uid_note()})"
            print(line, file=sys.stderr, flush=True)
            _chosen[requested] = mech
        return _chosen[requested]


def _uid_note() -> str:
    return f", uids {UID_BASE}+" if os.geteuid() == 0 else ", own uid"


def _pythons() -> list[str]:
    seen = [sys.executable, shutil.which("python3", path="/usr/bin:/bin") or ""]
    return [p for i, p in enumerate(seen) if p and p not in seen[:i]]


def _probe_bwrap() -> tuple[Mechanism | None, str]:
    path = shutil.which("bwrap")
    if path is None:
        return None, "not found"
    why = "?"
    for sized in (True, False):  # --size needs bubblewrap >= 0.8
        for python in _pythons():
            result = _run("print('ok')", Limits(wall_s=10), Mechanism("bwrap", python, path, sized))
            if result.stdout == "ok\n":
                return Mechanism("bwrap", python, path, sized), ""
            why = (result.stderr.strip().splitlines() or [result.reason])[-1]
    return None, f"not usable: {why}"


def _probe_rlimits() -> Mechanism:
    why = "?"
    for python in _pythons():
        result = _run("print('ok')", Limits(wall_s=10), Mechanism("rlimits", python))
        if result.stdout == "ok\n":
            return Mechanism("rlimits", python)
        why = (result.stderr.strip().splitlines() or [result.reason])[-1]
    raise RuntimeError(f"sandbox: no Python runs under process limits here ({why})")


def _run(source: str, limits: Limits, mech: Mechanism) -> Result:
    uid, lock = _acquire_uid() if os.geteuid() == 0 else (None, -1)
    workdir = tempfile.mkdtemp(prefix="rlpost-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w") as f:
            f.write(source)
        own = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        if uid is not None:
            os.chown(workdir, uid, uid)
            _kill_uid(uid, mech.python)  # anything left by a holder that crashed
        counted = uid if uid is not None else os.getuid()
        nproc = limits.max_procs + (1 if mech.name == "bwrap" else len(_live_pids(counted, zombies=True)))
        start = time.monotonic()  # the wall limit counts from the program's start
        try:
            proc = subprocess.Popen(
                mech.command(workdir, limits, nproc), cwd=workdir, env={}, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **own,
            )  # fmt: skip
        except OSError as exc:  # the interpreter or bwrap cannot be executed (as this uid)
            return Result("", f"could not start: {exc}", None, False, f"could not start: {exc}", 0.0)
        try:
            out, err, why = _collect(proc, limits, start)
        finally:
            _kill_tree(proc, uid, mech.python, workdir)
            status = proc.wait()
    finally:
        if uid is not None:
            if mech.name == "rlimits":
                _sweep(uid)
            os.close(lock)
        shutil.rmtree(workdir, ignore_errors=True)
    return _result(out, err, status, why, limits, mech, time.monotonic() - start)


def _collect(proc: subprocess.Popen, limits: Limits, start: float) -> tuple[bytes, bytes, str]:
    """Read both pipes up to the cap until they close; "" or why the program must be killed."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline, why = start + limits.wall_s, ""
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and not why:
            now = time.monotonic()
            if now >= deadline:
                why = "" if proc.poll() is not None else f"wall time {limits.wall_s:g} s exceeded"
                break  # exited but a leftover child holds the pipes: the kill closes them
            if proc.poll() is not None:
                deadline = min(deadline, now + 0.2)
            for key, _ in sel.select(min(deadline - now, 0.1)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += chunk[: limits.max_output_bytes - len(buf)]
                if len(buf) >= limits.max_output_bytes:
                    why = f"output over {limits.max_output_bytes} bytes"
    out, err = bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()])
    proc.stdout.close()
    proc.stderr.close()
    return out, err, why


def _result(
    out: bytes, err: bytes, status: int, why: str, limits: Limits, mech: Mechanism, wall: float
) -> Result:
    if mech.name == "bwrap" and 128 < status <= 128 + 64:
        status = 128 - status
    stderr = err.decode("utf-8", "replace")
    if why:
        return Result(out.decode("utf-8", "replace"), stderr, None, True, why, wall)
    if status < 0:
        sig = signal.Signals(-status) if -status in signal.Signals._value2member_map_ else -status
        name = getattr(sig, "name", f"signal {sig}")
        reason = f"cpu time {limits.cpu_s} s exceeded" if sig == signal.SIGXCPU else f"killed by {name}"
        if sig == signal.SIGKILL:
            reason += " (cpu time hard limit or out of memory)"
        return Result(out.decode("utf-8", "replace"), stderr, status, True, reason, wall)
    reason = "" if status == 0 else f"exit status {status}"
    if status and "MemoryError" in stderr[-2000:]:
        reason += f" (MemoryError: over the {limits.memory_mb} MB memory limit)"
    return Result(out.decode("utf-8", "replace"), stderr, status, False, reason, wall)


def _acquire_uid() -> tuple[int, int]:
    """A sandbox uid no other sandbox (in any process) holds, and the locked file that holds it."""
    folder = _lock_dir()
    while True:
        in_use = _uids_with_processes()  # zombies too: a uid whose dead are not yet reaped comes last
        for uid in sorted(range(UID_BASE, UID_BASE + UID_SLOTS), key=lambda uid: uid in in_use):
            if _has_account(uid):
                continue  # a real account: never kill(-1) as it
            fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except BlockingIOError:
                os.close(fd)
        time.sleep(0.05)  # all busy: wait for one


def _lock_dir() -> str:
    """A root-owned folder for the uid locks (not one a sandboxed program could have made first)."""
    for folder in LOCK_DIRS:
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError:
            continue
        st = os.lstat(folder)
        if (
            st.st_uid == 0
            and (st.st_mode & 0o7777) == 0o700
            and os.path.isdir(folder)
            and not os.path.islink(folder)
        ):
            return folder
    raise RuntimeError(
        f"sandbox: none of {', '.join(LOCK_DIRS)} is a root-owned 0700 folder; remove or fix it"
    )


def _uids_with_processes() -> set[int]:
    uids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uids.add(os.stat(f"/proc/{name}").st_uid)
            except OSError:
                pass  # gone meanwhile
    return uids


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _live_pids(uid: int, zombies: bool = False) -> list[int]:
    """Processes of `uid`, without zombies unless asked (dead, not yet reaped; RLIMIT_NPROC still counts them)."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                with open(f"/proc/{name}/stat") as f:
                    if zombies or f.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                        pids.append(int(name))
        except (OSError, IndexError):
            pass  # gone meanwhile
    return pids


def _kill_uid(uid: int, python: str) -> None:
    """Kill every process of `uid`: kill(-1, SIGKILL) from a helper running as that uid, until none is left."""
    for _ in range(50):
        if not _live_pids(uid):
            return
        try:
            subprocess.run(
                [python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"], env={}, user=uid, group=uid,
                extra_groups=[], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=10,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):  # that Python does not run as `uid`: kill one by one
            for pid in _live_pids(uid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.01)
    raise RuntimeError(f"sandbox: processes of uid {uid} survive kill(-1, SIGKILL): {_live_pids(uid)}")


def _kill_tree(proc: subprocess.Popen, uid: int | None, python: str, workdir: str) -> None:
    """Kill the program and everything it started, and wait until they are gone."""
    if uid is not None:
        _kill_uid(uid, python)
        return
    # not root: the session Popen started (start_new_session), every process running the program's file
    # (a setsid() child that did not exec), and under bwrap every process of the pid namespace its first
    # child leads (a setsid() inside leaves the session, never the namespace)
    me, sid, main = os.getpid(), proc.pid, os.path.join(workdir, "main.py").encode()
    spaces = {_pid_ns(pid) for pid in _live_pids(os.getuid()) if _field(pid, 1) == proc.pid} - {_pid_ns(me)}
    for _ in range(100):
        members = [
            pid
            for pid in _live_pids(os.getuid())
            if pid != me
            and (_field(pid, 3) == sid or _pid_ns(pid) in spaces - {None} or main in _cmdline(pid))
        ]
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _field(pid: int, index: int) -> int | None:
    """A number from /proc/<pid>/stat after the command name: 1 the parent, 3 the session."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[index])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _sweep(uid: int) -> None:
    """Remove what the sandbox uid left in world-writable folders (`rlimits` as root: it could write there)."""
    for folder in WORLD_WRITABLE:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass
