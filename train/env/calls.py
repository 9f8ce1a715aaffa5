"""Calls into user code (tools, environments) bounded in time, on a pool that hangs cannot use up or pin.

A tool or an environment is code the trainer does not control: it may raise anything (`SystemExit` and
`KeyboardInterrupt` included), return anything or never return. Each call runs on one of `workers` daemon
threads; whatever it raises becomes `CallFailed(kind="raised")` with a message made in that thread (a
hostile `__str__` never runs in the trainer's thread). A call still running `timeout_s` after it started is
failed (`kind="timeout"`) by `reap()` and its thread abandoned: a fresh thread takes its place, so later
calls never queue behind a hung one, and the abandoned thread leaves when (if ever) the call returns.
Threads are daemons and never joined, so a call hung forever does not hold up the process's exit
(`concurrent.futures.ThreadPoolExecutor` joins its workers at exit, which is why it is not used here).

A thread cannot be killed: an abandoned call keeps its thread and memory until it returns or the process
ends (`abandoned` counts them), and `os._exit` in user code ends the process. Code that can hang for good or
must be contained runs in a subprocess of its own (the python tool's sandbox, train/env/sandbox.py).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

MESSAGE_CHARS = 300  # of a failure's description


class CallFailed(Exception):
    """A call's failure in plain strings: `kind` (raised, timeout, or what a check says) and a message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def describe(exc: BaseException, limit: int = MESSAGE_CHARS, with_type: bool = True) -> str:
    """`Type: message` (or the message alone) of an exception from user code, cut to `limit` characters;
    never raises, though its `__str__` may."""
    name = type(exc).__name__
    try:
        text = str(exc)[:limit].strip()
    except BaseException:  # noqa: BLE001 -- a broken __str__ still leaves the type to tell
        text = ""
    if not text:
        return name
    return (f"{name}: {text}" if with_type else text)[:limit]


@dataclass(eq=False)
class _Call:
    future: Future
    fn: Callable[..., Any]
    args: tuple
    started: float = 0.0  # time.monotonic() when a worker began it


class CallPool:
    """At most `workers` calls of user code at a time, each failed after `timeout_s` of running."""

    def __init__(self, workers: int, timeout_s: float, name: str = "env") -> None:
        if workers < 1:
            raise ValueError(f"workers={workers}: expected >= 1")
        self.workers, self.timeout_s, self.name = workers, timeout_s, name
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[Future, _Call] = {}
        self._serving = 0  # threads taking calls from the queue (abandoned ones excluded)
        self._abandoned = 0  # threads still inside a call that was failed for its time
        self._names = itertools.count()
        self._closed = False
        self.threads: list[threading.Thread] = []  # every thread started (tests check they end)

    @property
    def abandoned(self) -> int:
        """Threads still running a call that timed out (they leave when it returns)."""
        return self._abandoned

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue `fn(*args)`; its Future holds the result, or a CallFailed."""
        if self._closed:
            raise RuntimeError("CallPool is closed")
        call = _Call(Future(), fn, args)
        self._queue.put(call)
        self._grow()
        return call.future

    def reap(self) -> None:
        """Fail every call running past `timeout_s` and start a thread in place of each one's."""
        now = time.monotonic()
        with self._lock:
            late = [c for c in self._running.values() if now - c.started >= self.timeout_s]
            for c in late:
                del self._running[c.future]
            self._serving -= len(late)
            self._abandoned += len(late)
        for c in late:
            c.future.set_exception(CallFailed("timeout", f"no answer within {self.timeout_s:g} s"))
        if late:
            self._grow()

    def wait(self, futures: Iterable[Future]) -> None:
        """Until one of `futures` is done or a running call's time is up (then it is reaped)."""
        futures = list(futures)
        now = time.monotonic()
        with self._lock:
            deadlines = [c.started + self.timeout_s for c in self._running.values()]
        # a call that starts later has its deadline after now + timeout_s: waking then is soon enough
        timeout = max(0.0, min([now + self.timeout_s, *deadlines]) - now)
        if futures and not any(f.done() for f in futures):
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
        self.reap()

    def settle(self, futures: Iterable[Future]) -> None:
        """Until every one of `futures` is done (answered, raised or timed out)."""
        futures = list(futures)
        while not all(f.done() for f in futures):
            self.wait([f for f in futures if not f.done()])

    def close(self) -> None:
        """Cancel queued calls and let idle threads leave; running ones are left to finish (daemons)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            serving = self._serving
        while True:
            try:
                call = self._queue.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call.future.cancel()
        for _ in range(serving):
            self._queue.put(None)

    def _grow(self) -> None:
        with self._lock:
            missing = 0 if self._closed else self.workers - self._serving
            self._serving += max(0, missing)
        for _ in range(missing):
            thread = threading.Thread(
                target=self._serve, name=f"{self.name}-{next(self._names)}", daemon=True
            )
            self.threads.append(thread)
            thread.start()

    def _serve(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            if not call.future.set_running_or_notify_cancel():
                continue
            with self._lock:
                call.started = time.monotonic()
                self._running[call.future] = call
            try:
                value, failure = call.fn(*call.args), None
            except CallFailed as exc:
                value, failure = None, CallFailed(str(exc.kind), str(exc.message)[:MESSAGE_CHARS])
            except BaseException as exc:  # noqa: BLE001 -- SystemExit, KeyboardInterrupt from user code too
                value, failure = None, CallFailed("raised", describe(exc))
            with self._lock:
                abandoned = self._running.pop(call.future, None) is None
                if abandoned:
                    self._abandoned -= 1
            if abandoned:  # failed for its time; a replacement serves the queue
                return
            if failure is None:
                call.future.set_result(value)
            else:
                call.future.set_exception(failure)
