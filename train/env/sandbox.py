"""Run untrusted Python source in a separate, limited process (the `python` tool's sandbox).

Why: code a model wrote must not read the trainer's secrets (its environment, its files), reach the network,
fill the disk, outlive its call, or take the machine down (fork bomb, endless loop, 10 GB allocation, 100 MB
of output). Three mechanisms. `auto` takes the first that runs here, `bwrap` then `unshare`, decided once per
process and logged in one line; with neither it refuses (a RuntimeError naming the opt-in) instead of falling
back to `rlimits`, which leaves too much open to be chosen silently:

- `bwrap` (bubblewrap, Debian package `bubblewrap`): new user, pid, network, ipc and uts namespaces; of the host
  only /usr (with the /bin, /lib.. links) and the program's Python, read-only; an empty read-only /tmp; the
  working folder and /dev/shm private tmpfs of `disk_mb` each (bubblewrap >= 0.8; an older one runs without
  the cap, and the log line says so); no network; the pid namespace dies with its first process.
- `unshare` (root only, no extra program): new mount, pid, network, ipc and uts namespaces made by unshare(2);
  a new root that is one tmpfs of `disk_mb` holding /tmp, /dev/shm and the working folder; the same read-only
  host paths; a /proc of its own pid namespace; no network, not even loopback. The program runs as the
  sandbox uid under the namespace's init (root), and the kernel kills what is left when init exits.
- `rlimits` (only when asked for, `mechanism="rlimits"`): process limits alone. The network, world-readable
  files and other processes' command lines stay reachable and disk is capped per file only (`file_mb`). As
  root the program runs as a dedicated uid, so RLIMIT_NPROC holds, the trainer's /proc/<pid>/environ and its
  files that are not world-readable are unreadable, and what it left in world-writable folders is swept
  afterwards. Not root: its own uid, so it can read the trainer's environment and write wherever the user may;
  RLIMIT_NPROC at its current process count plus a margin, and at the end its session and every process still
  running its file killed (a child that starts a new session and then runs another program escapes).

All three: rlimits on CPU seconds, address space, processes, file size and open files; no new privileges; an
empty environment; a fresh working folder removed afterwards; stdout and stderr read up to a byte cap each
(past it the program is killed, never buffered); a wall-clock limit; the whole process tree killed at the end.
As root each sandbox holds its own uid from a pool of uids without an account (UID_BASE.., a file lock per uid,
so concurrent sandboxes in any process never share one): limits, the final kill(-1) run as that uid, and the
sweep touch that sandbox only. The program's Python is the trainer's when the sandbox can run it, else
/usr/bin/python3 (the trainer's venv may live under a folder only root can enter). What each mechanism
isolates is measured by tests/test_sandbox.py and tabled in docs/agents.md.
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

MECHANISMS = ("auto", "bwrap", "unshare", "rlimits")
UID_BASE, UID_SLOTS = 64000, 64  # uids with no account: each running sandbox holds one (as root)
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # swept of a sandbox uid's files (rlimits)
LOCK_DIRS = ("/run/rlpost-sandbox-uids", os.path.join(tempfile.gettempdir(), "rlpost-sandbox-uids"))
# The host paths a program sees under bwrap and unshare (read-only, those that exist), besides its Python's own
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
OPEN_UNDER_RLIMITS = "the network, world-readable files and other processes stay reachable, disk is unbounded"

# Runs first. Under bwrap and rlimits it is already the program's uid: it lowers the limits, then executes the
# program's file in a fresh interpreter (-E -s: no PYTHON* variables, no user site; -u: what was printed before
# a kill is kept). Under unshare it starts as root and first builds the program's world: new mount, pid,
# network, ipc and uts namespaces; a tmpfs of disk_mb as the new root, holding /tmp, /dev/shm and the working
# folder; the visible host paths bound read-only; five device nodes; a /proc of its own. The namespace's init
# (pid 1, root) starts the program as the sandbox uid, reaps orphans and reports the program's status when it
# ends; the launcher ends the same way. When init exits (or the launcher or the trainer dies) the kernel kills
# everything left in the pid namespace.
LAUNCHER = r"""
import ctypes, os, resource as r, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
cpu, mem, nproc, fsize, nofile = map(int, sys.argv[1:6])
main = sys.argv[6]
workdir = os.path.dirname(main)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, MOVE, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 8192, 16384, 1 << 18


def run_program():
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid programs gain nothing
    for res, soft, hard in ((r.RLIMIT_CPU, cpu, cpu + 1), (r.RLIMIT_AS, mem, mem), (r.RLIMIT_NPROC, nproc, nproc),
                            (r.RLIMIT_FSIZE, fsize, fsize), (r.RLIMIT_NOFILE, nofile, nofile), (r.RLIMIT_CORE, 0, 0)):
        top = r.getrlimit(res)[1]
        r.setrlimit(res, (soft, hard) if top == r.RLIM_INFINITY else (min(soft, top), min(hard, top)))
    os.execv(sys.executable, [sys.executable, "-E", "-s", "-u", main])


def check(ret, what):
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, kind, flags, data=None):
    source, target, kind, data = (None if s is None else s.encode() for s in (source, target, kind, data))
    check(libc.mount(source, target, kind, ctypes.c_ulong(flags), data), f"mount {target.decode()}")


def build_root(uid, disk, visible):
    with open(main, "rb") as f:
        source = f.read()
    os.umask(0o022)
    mount(None, "/", None, REC | PRIVATE)  # nothing mounted below reaches the host
    new = workdir  # the new root: hides the host's working folder (main.py was read above)
    mount("tmpfs", new, "tmpfs", NOSUID | NODEV, f"size={disk},mode=755")
    for path in visible:
        target = new + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target) if os.path.isdir(path) else open(target, "x").close()
        mount(path, target, None, BIND)
        mount(None, target, None, BIND | REMOUNT | RDONLY | NOSUID | NODEV)
    for folder, mode in (("/tmp", 0o1777), ("/dev/shm", 0o1777), ("/proc", 0o555), (workdir, 0o700)):
        os.makedirs(new + folder, exist_ok=True)
        os.chmod(new + folder, mode)
    for device in ("null", "zero", "full", "random", "urandom"):
        open(f"{new}/dev/{device}", "x").close()
        mount(f"/dev/{device}", f"{new}/dev/{device}", None, BIND)
    for i, link in enumerate(("stdin", "stdout", "stderr", "fd")):
        os.symlink("/proc/self/fd" + ("" if link == "fd" else f"/{i}"), f"{new}/dev/{link}")
    os.chown(new + workdir, uid, uid)
    with open(new + main, "wb") as f:
        f.write(source)
    os.chdir(new)
    mount(new, "/", None, MOVE)
    os.chroot(".")


if len(sys.argv) == 7:  # bwrap, rlimits
    run_program()
uid, disk, visible = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9:]
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the trainer
check(libc.unshare(0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000), "unshare")  # mnt pid net ipc uts
build_root(uid, disk, visible)
status_r, status_w = os.pipe()
init = os.fork()
if init == 0:  # pid 1 of the new pid namespace
    try:
        libc.prctl(1, signal.SIGKILL)
        mount("proc", "/proc", "proc", NOSUID | NODEV | NOEXEC)
        program = os.fork()
        if program == 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.chdir(workdir)
            run_program()
        while True:
            pid, status = os.wait()
            if pid == program:
                os.write(status_w, str(status).encode())
                os._exit(0)
    except BaseException as exc:
        print(f"sandbox: {exc!r}", file=sys.stderr, flush=True)
        os._exit(1)
os.close(status_w)
status = os.read(status_r, 32)
os.waitpid(init, 0)
if not status:
    sys.exit("sandbox: its init ended before the program")
status = int(status)
if os.WIFSIGNALED(status):  # end by the same signal, so the caller reads it
    sig = os.WTERMSIG(status)
    r.setrlimit(r.RLIMIT_CORE, (0, 0))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)
os._exit(os.waitstatus_to_exitcode(status))
"""


@dataclass(frozen=True)
class Limits:
    """What one program may use. `disk_mb` caps what it can write: under unshare its folder, /tmp and /dev/shm
    together, under bwrap its folder and /dev/shm each (/tmp is read-only); `rlimits` bounds each file by
    `file_mb` only. `max_procs` counts the program's own processes, the first one included (under `rlimits` and
    `unshare` also its uid's dead processes not yet reaped, as RLIMIT_NPROC does)."""

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
    name: str  # "bwrap" | "unshare" | "rlimits"
    python: str
    bwrap: str | None = None
    sized_tmpfs: bool = True

    def command(self, workdir: str, limits: Limits, nproc: int, uid: int | None = None) -> list[str]:
        """The command line that runs `workdir`/main.py; `uid` (unshare): the uid the launcher drops to."""
        mb = 1 << 20
        main = os.path.join(workdir, "main.py")
        numbers = (limits.cpu_s, limits.memory_mb * mb, nproc, limits.file_mb * mb, limits.open_files)
        inner = [self.python, "-I", "-S", "-c", LAUNCHER, *map(str, numbers), main]
        if self.name == "unshare":
            return [*inner, str(uid), str(limits.disk_mb * mb), *visible_paths(self.python)]
        if self.name != "bwrap":
            return inner
        view = []
        for path in visible_paths(self.python):
            view += (
                ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
            )
        size = ["--size", str(limits.disk_mb * mb)] if self.sized_tmpfs else []
        return [
            *(self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"),
            *view, *("--dev", "/dev", "--proc", "/proc"),
            *size, *("--tmpfs", "/dev/shm", "--tmpfs", "/tmp"), *size, *("--tmpfs", workdir),
            *("--ro-bind", main, main, "--remount-ro", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/"),
            *("--chdir", workdir, "--"), *inner,
        ]  # fmt: skip


def visible_paths(python: str) -> list[str]:
    """The host paths a program sees under bwrap and unshare, read-only: the system's programs and libraries
    and `python`'s installation and venv (so it can run), nothing else (no home, no data, no repository)."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    own = [os.path.dirname(os.path.dirname(os.path.realpath(python)))]
    own += [venv] if os.path.isfile(os.path.join(venv, "pyvenv.cfg")) else []
    paths = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    for path in own:
        inside = any(path == p or path.startswith(p + "/") for p in paths if not os.path.islink(p))
        if path != "/" and not inside:
            paths.append(path)
    return paths


def run(source: str, limits: Limits | None = None, mechanism: str = "auto") -> Result:
    """Run `source` as a Python program under `limits`; never raises for anything the program does."""
    limits = limits or Limits()
    return _run(source, limits, choose(mechanism))


_chosen: dict[str, Mechanism] = {}
_choose_lock = threading.Lock()


def choose(requested: str = "auto") -> Mechanism:
    """The mechanism for `requested` (decided once per process, logged in one line). `auto`: bwrap, else
    unshare, else a RuntimeError naming the opt-in (`rlimits` leaves too much open to be a silent fallback); a
    named mechanism that cannot run here is a RuntimeError naming why."""
    if requested not in MECHANISMS:
        raise ValueError(f"sandbox mechanism={requested!r}: expected one of {', '.join(MECHANISMS)}")
    with _choose_lock:
        if requested not in _chosen:
            mech, line = _decide(requested)
            print(line, file=sys.stderr, flush=True)
            _chosen[requested] = mech
        return _chosen[requested]


def _decide(requested: str) -> tuple[Mechanism, str]:
    """The mechanism for `requested` and its log line, or a RuntimeError saying why none."""
    if requested == "rlimits":
        mech = _probe_rlimits()
        python = f"python {mech.python}{_uid_note()}"
        return mech, f"sandbox: process limits alone (mechanism=rlimits: {OPEN_UNDER_RLIMITS}; {python})"
    whys = {}
    for name, probe in (("bwrap", _probe_bwrap), ("unshare", _probe_unshare)):
        if requested not in ("auto", name):
            continue
        mech, whys[name] = probe()
        if mech is None:
            continue
        notes = [f"bwrap {whys['bwrap']}"] if name == "unshare" and "bwrap" in whys else []
        if not mech.sized_tmpfs:
            notes.append("bubblewrap < 0.8 has no --size: its folder and /dev/shm are not capped")
        notes.append(f"python {mech.python}{_uid_note()}")
        how = f"bubblewrap {mech.bwrap}" if name == "bwrap" else "namespaces by unshare(2)"
        return mech, f"sandbox: {how} ({'; '.join(notes)})"
    if requested != "auto":
        fix = "install bubblewrap" if requested == "bwrap" else "run as root (with CAP_SYS_ADMIN)"
        raise RuntimeError(f"sandbox mechanism={requested}: not usable here ({whys[requested]}); {fix}")
    raise RuntimeError(
        f"sandbox: nothing here isolates the python tool (bwrap {whys['bwrap']}; unshare {whys['unshare']}): "
        "install bubblewrap or run as root, or opt in to process limits alone with the tool's "
        f"mechanism=rlimits ({OPEN_UNDER_RLIMITS}; docs/agents.md)"
    )


def _uid_note() -> str:
    return f", uids {UID_BASE}+" if os.geteuid() == 0 else ", own uid"


def _pythons() -> list[str]:
    seen = [sys.executable, shutil.which("python3", path="/usr/bin:/bin") or ""]
    return [p for i, p in enumerate(seen) if p and p not in seen[:i]]


def _probe_bwrap() -> tuple[Mechanism | None, str]:
    path = shutil.which("bwrap")
    if path is None:
        return None, "not found"
    return _probe("bwrap", path)


def _probe_unshare() -> tuple[Mechanism | None, str]:
    if os.geteuid() != 0:
        return None, "needs root"
    return _probe("unshare")


def _probe_rlimits() -> Mechanism:
    mech, why = _probe("rlimits")
    if mech is None:
        raise RuntimeError(f"sandbox: no Python runs under process limits here ({why})")
    return mech


def _probe(name: str, bwrap: str | None = None) -> tuple[Mechanism | None, str]:
    """The first of this machine's Pythons that prints under `name` ("" then), else why none does."""
    why = "?"
    for sized in (True, False) if name == "bwrap" else (True,):  # --size needs bubblewrap >= 0.8
        for python in _pythons():
            mech = Mechanism(name, python, bwrap, sized)
            result = _run("print('ok')", Limits(wall_s=10), mech)
            if result.stdout == "ok\n":
                return mech, ""
            why = (result.stderr.strip().splitlines() or [result.reason])[-1]
    return None, f"not usable: {why}"


def _run(source: str, limits: Limits, mech: Mechanism) -> Result:
    uid, lock = _acquire_uid() if os.geteuid() == 0 else (None, -1)
    workdir = tempfile.mkdtemp(prefix="rlpost-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w") as f:
            f.write(source)
        dropped = uid is None or mech.name == "unshare"  # unshare's launcher drops to the uid itself
        own = {} if dropped else {"user": uid, "group": uid, "extra_groups": []}
        if uid is not None:
            os.chown(workdir, uid, uid)
            _kill_uid(uid, mech.python)  # anything left by a holder that crashed
        counted = uid if uid is not None else os.getuid()
        nproc = limits.max_procs + (1 if mech.name == "bwrap" else len(_live_pids(counted, zombies=True)))
        start = time.monotonic()  # the wall limit counts from the program's start
        try:
            proc = subprocess.Popen(
                mech.command(workdir, limits, nproc, uid), cwd=workdir, env={}, stdin=subprocess.DEVNULL,
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
