"""Persistent worker processes that run sympy comparisons under a hard per-comparison time limit.

sympy can hang (simplify on a nasty expression, C-level big-int work), and a hung call can't be
interrupted from another thread, so comparisons run in child processes. Each worker does one comparison
at a time, so the parent knows exactly when each started: a worker past its deadline is killed and
replaced alone while the others keep going. Workers are fresh interpreters (`python -m` via subprocess,
like the spawn start method but without re-running the caller's __main__), never fork, because the
trainer process may hold threads. Inside a worker a SIGALRM soft limit (at 80% of the time limit)
usually stops sympy first; the kill at the time limit is the backstop. Workers also get an address-space
limit, and die with the grading process: the kernel kills them when it dies (PR_SET_PDEATHSIG, Linux; the
workers are started from one long-lived thread, since the signal follows the thread that started them)
and a watchdog thread exits them when their parent changes (other systems). The protocol is JSON lines
on stdin/stdout.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future

SOFT_LIMIT_FRACTION = 0.8  # the worker's own alarm, as a share of the time limit; the kill comes at 100%
MIN_KILL_AFTER_S = 0.2
STARTUP_TIMEOUT_S = 60.0
WORKER_MEMORY_BYTES = 4 << 30
PARENT_ENV = "RLPOST_GRADER_PARENT_PID"
WATCHDOG_PERIOD_S = 0.5


# one comparison of each kind a worker does (simplify, relations, intervals, matrices, functions), run before
# a worker reports ready
WARM_UP_PAIRS = (
    ("\\frac{x^2-1}{x-1}", "x+1"),
    ("x^2+2x+1=0", "(x+1)^2=0"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("[1,2)", "1\\le x<2"),
    ("\\sin^2 x+\\cos^2 x", "1"),
    ("\\begin{pmatrix}1&x\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1&x\\\\3&4\\end{pmatrix}"),
    ("\\log_2 8+e^{\\pi}", "3+e^{\\pi}"),
    ("\\{1,\\frac{x}{2}\\}", "\\{\\frac{x}{2},1\\}"),
)


def _warm_up_sympy(limit_s: float = 10.0) -> None:
    """sympy loads parts of itself on first use (~0.4 s): do that here, before the worker reports ready,
    not in a graded call. Bounded by an alarm; a failure only leaves the load to the first real call."""
    from math_grader.equiv import structural_equiv, sympy_scalar_eq

    signal.signal(signal.SIGALRM, _alarm_handler)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        for pred, gold in WARM_UP_PAIRS:
            structural_equiv(pred, gold, sympy_scalar_eq)
    except Exception:  # noqa: BLE001 - warming up is best effort
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _alarm_handler(signum: int, frame: object) -> None:
    raise TimeoutError("comparison timed out")


def _compare_with_alarm(pred: str, gold: str, timeout_s: float, ordered: bool = False) -> bool:
    from math_grader.equiv import full_equiv

    signal.signal(signal.SIGALRM, _alarm_handler)
    signal.setitimer(signal.ITIMER_REAL, max(timeout_s * SOFT_LIMIT_FRACTION, 0.01))
    try:
        return bool(full_equiv(pred, gold, ordered))
    except Exception:  # noqa: BLE001 - time-outs and grader bugs score 0, never crash a training run
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def die_with_parent() -> None:
    """Exit when the process that started this worker dies, even mid-computation (also after kill -9)."""
    parent = int(os.environ.get(PARENT_ENV, "0")) or os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills us when the parent thread dies
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog below still notices

    def watchdog() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_PERIOD_S)
        os._exit(1)

    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=watchdog, name="grader-parent-watchdog", daemon=True).start()


def worker_main() -> None:
    """Child loop: read {"i", "p", "g", "t", "o"} lines from stdin, answer {"i", "ok"} lines on stdout."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    import math_grader.equiv  # noqa: F401 - import before reporting ready
    import math_grader.parse  # noqa: F401 - imports sympy (seconds), which must not eat a comparison's time

    _warm_up_sympy()
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        ok = _compare_with_alarm(str(msg["p"]), str(msg["g"]), float(msg["t"]), bool(msg.get("o")))
        out.write(json.dumps({"i": msg["i"], "ok": ok}) + "\n")
        out.flush()


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env[PARENT_ENV] = str(os.getpid())
    return env


# -P: no current directory on sys.path, so a worker imports the same math_grader as its parent (PYTHONPATH)
WORKER_CMD = [sys.executable, "-P", "-c", "from math_grader.pool import worker_main; worker_main()"]


class _Spawner:
    """Starts every worker from one daemon thread that lives as long as the process: PR_SET_PDEATHSIG
    fires when the *thread* that started a child ends, so a short-lived caller thread must not start them."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[list[str], Future]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _loop(self) -> None:
        while True:
            cmd, future = self._requests.get()
            try:
                future.set_result(
                    subprocess.Popen(
                        cmd,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        env=_worker_env(),
                        text=True,
                        bufsize=1,
                    )
                )
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)

    def popen(self, cmd: list[str]) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="grader-spawner", daemon=True)
                self._thread.start()
        future: Future = Future()
        self._requests.put((cmd, future))
        return future.result()


_SPAWNER = _Spawner()


class _Worker:
    def __init__(self, cmd: list[str]) -> None:
        self.proc = _SPAWNER.popen(cmd)
        self.ready = False
        self.born = time.monotonic()
        self.task: int | None = None
        self.started = 0.0

    def send(self, idx: int, pred: str, gold: str, timeout_s: float, ordered: bool = False) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            json.dumps({"i": idx, "p": pred, "g": gold, "t": timeout_s, "o": ordered}) + "\n"
        )
        self.proc.stdin.flush()

    def recv(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("worker exited")
        return json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)
        self._close_pipes()

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


class GraderPool:
    """Runs full comparisons in `num_workers` processes; thread-safe (calls are serialised)."""

    def __init__(self, num_workers: int | None = None, worker_cmd: list[str] | None = None):
        self.num_workers = max(1, num_workers or min(4, os.cpu_count() or 1))
        self.worker_cmd = list(worker_cmd or WORKER_CMD)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.kills = 0
        self._startup_failures = 0

    def _fill(self) -> None:
        self._workers = [w for w in self._workers if w.proc.poll() is None]
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self.worker_cmd))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self._workers.append(_Worker(self.worker_cmd))

    def start(self) -> None:
        """Start the worker processes now and return at once: they import sympy (1-2 s) while the caller
        generates, so no grading call waits for them (each one's ready line is read by the next run)."""
        with self._lock:
            self._fill()

    def run(self, tasks: list[tuple[str, str, bool]], timeout_s: float) -> list[bool]:
        """Compare every (pred, gold, ordered); a comparison past timeout_s is killed and scored False."""
        results = [False] * len(tasks)
        if not tasks:
            return results
        with self._lock:
            self._fill()
            todo = deque(range(len(tasks)))
            while todo or any(w.task is not None for w in self._workers):
                self._dispatch(todo, tasks, timeout_s)
                self._collect(results, timeout_s)
        return results

    def _dispatch(self, todo: deque[int], tasks: list[tuple[str, str, bool]], timeout_s: float) -> None:
        for w in self._workers:
            if not todo:
                return
            if w.ready and w.task is None:
                idx = todo.popleft()
                w.task, w.started = idx, time.monotonic()
                try:
                    w.send(
                        idx, tasks[idx][0], tasks[idx][1], timeout_s, bool(tasks[idx][2:3] and tasks[idx][2])
                    )
                except OSError:
                    w.task = None
                    todo.appendleft(idx)
                    self._replace(w)
                    return

    def _deadline(self, w: _Worker, timeout_s: float) -> float:
        if not w.ready:
            return w.born + STARTUP_TIMEOUT_S
        return w.started + max(timeout_s, MIN_KILL_AFTER_S) if w.task is not None else float("inf")

    def _collect(self, results: list[bool], timeout_s: float) -> None:
        waiting = [w for w in self._workers if w.task is not None or not w.ready]
        if not waiting:
            return
        next_deadline = min(self._deadline(w, timeout_s) for w in waiting)
        with selectors.DefaultSelector() as sel:
            for w in waiting:
                sel.register(w.proc.stdout, selectors.EVENT_READ, w)
            events = sel.select(timeout=max(0.0, next_deadline - time.monotonic()))
        for key, _ in events:
            self._receive(key.data, results)
        now = time.monotonic()
        for w in list(self._workers):
            if (w.task is not None or not w.ready) and now > self._deadline(w, timeout_s):
                self.kills += 1
                self._replace(w)

    def _receive(self, w: _Worker, results: list[bool]) -> None:
        try:
            msg = w.recv()
        except (EOFError, OSError, ValueError):
            if not w.ready:
                self._startup_failures += 1
                if self._startup_failures > 3:
                    raise RuntimeError("math grader workers fail to start") from None
            w.task = None
            self._replace(w)  # crashed (e.g. out of memory): its comparison scores False
            return
        if msg.get("ready"):
            w.ready = True
            return
        if msg.get("i") == w.task and w.task is not None:
            results[w.task] = bool(msg.get("ok"))
        w.task = None

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.stop()
            self._workers = []


_POOL: GraderPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(num_workers: int | None = None) -> GraderPool:
    """The module-level pool, created lazily (and recreated if a different size is asked for)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or (num_workers is not None and num_workers != _POOL.num_workers):
            if _POOL is not None:
                _POOL.close()
            _POOL = GraderPool(num_workers)
        return _POOL


@atexit.register
def shutdown_pool() -> None:
    """Stop the worker processes (also called at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None


if __name__ == "__main__":
    worker_main()
