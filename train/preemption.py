"""Preemption: what a training job does when the cluster takes the machine away.

Slurm sends SIGTERM on preemption, `scancel`, `scontrol requeue` and at the time limit (then SIGKILL
after its KillWait, 30 s by default), and submitit asks for SIGUSR2 `signal_delay_s` before the time
limit (its hook then checkpoints and requeues the job). Either signal, handled once:

- a single-process run: the training loop's `PreemptWatch` notes it; the current step finishes (or is
  abandoned, leaving the last save's time out of the `preempt_grace_s` budget for the save), a checkpoint
  is written (`checkpoint_on_preempt`; abandoned too when still running at the budget), the loop raises
  `Preempted`, the MLflow run is marked KILLED (a requeued job reopens it: the same run goes on), and
  the caller exits (`python -m train`: status 128 + signal; a sweep job: submitit's USR2 hook requeues).
- several ranks under torchrun (`orchestration/ranks.py`): the launcher handles the signal. torchrun and
  the ranks are started with SIGUSR2 ignored (a signal Slurm sends to every process of the job would
  otherwise kill them); the launcher writes `request` in the ranks' control folder
  (`$RLPOST_PREEMPT_DIR`), every rank reads it at the step boundary and the ranks agree (one
  all-gather), so the checkpoint, a collective, is written by all of them after the same step. Each
  node's local rank 0 writes `outcome.json` there; the launcher then raises `Preempted` itself.

`Preempted` is a BaseException the checkpoint writer looks for too (`preempted_in`): a save abandoned past
the budget surfaces wrapped in the checkpoint library's own exceptions and must still end the run as
preempted (KILLED), not as failed. The launcher's side is orchestration/preempt.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class Preempted(BaseException):
    """A run stopped on a preemption signal (a BaseException, as KeyboardInterrupt: an abandoned step
    may be inside code that catches Exception). `checkpoint`: the step folder written on the way out
    (None: none was due or it was abandoned); `step`: the last step completed; `saving`: abandoned
    during the save of `step` (else during the step after it). It survives pickling: code it crosses
    (torch.distributed.checkpoint gathers the ranks' exceptions) may copy it."""

    def __init__(self, signame: str, step: int, checkpoint: str | None = None, abandoned: bool = False,
                 received_at: float | None = None, saving: bool = False) -> None:  # fmt: skip
        self.signame, self.step, self.checkpoint, self.abandoned = signame, step, checkpoint, abandoned
        self.received_at = received_at if received_at is not None else time.time()
        self.saving = saving
        super().__init__(self.describe())

    def __reduce__(self):  # BaseException's would call __init__ with the message alone
        return (Preempted, (self.signame, self.step, self.checkpoint, self.abandoned, self.received_at,
                            self.saving))  # fmt: skip

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.signame])

    def describe(self) -> str:
        if self.abandoned:
            what = f"the save of step {self.step}" if self.saving else f"the step after {self.step}"
            return f"{self.signame}: {what} abandoned, no checkpoint written on the way out"
        saved = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint due"
        return f"{self.signame}: stopped after step {self.step}, {saved}"

    def as_dict(self) -> dict:
        return {"signal": self.signame, "step": self.step, "checkpoint": self.checkpoint,
                "abandoned": self.abandoned, "received_at": self.received_at, "exited_at": time.time(),
                "saving": self.saving}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> Preempted:
        return cls(d["signal"], int(d["step"]), d.get("checkpoint"), bool(d.get("abandoned")),
                   d.get("received_at"), bool(d.get("saving")))  # fmt: skip


def exceptions_in(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then (breadth first) its causes and contexts and the per-rank failures that
    torch.distributed.checkpoint's CheckpointException carries, each once."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # rank -> (exception, its stack summary)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]


def preempted_in(exc: BaseException) -> Preempted | None:
    """The `Preempted` inside `exc` (see `exceptions_in`), or None: a save abandoned past the budget
    ends the run as preempted, not as failed."""
    return next((e for e in exceptions_in(exc) if isinstance(e, Preempted)), None)


PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
CONTROL_DIR_ENV = "RLPOST_PREEMPT_DIR"  # set by the launcher for its ranks: request / outcome.json
REQUEST = "request"
OUTCOME = "outcome.json"


def signame(signum: int) -> str:
    return signal.Signals(signum).name


class PreemptWatch:
    """Notes SIGTERM / SIGUSR2 while a training loop runs (installed on entry, the previous handlers
    restored on exit). A signal the launcher handles (inherited as ignored, with a control folder) is
    left ignored; the launcher's request arrives through the control folder instead.

    `grace_s` > 0 is the whole exit's budget, from the signal to the end of the checkpoint written on the
    way out, so the process exits before the scheduler's SIGKILL: the step still running is abandoned
    (`Preempted` raised where the main thread is) `grace_s - save_s` after the signal, leaving the last
    save's measured time `save_s` for the save (`disarm()` when the step ended in time), and a save
    (inside `saving()`) still running `grace_s` after the signal is abandoned too."""

    def __init__(self, grace_s: float = 0.0, say: Callable[[str], None] = print, save_s: float = 0.0) -> None:
        self.grace_s, self.say = grace_s, say
        self.save_s = save_s  # the last save's duration (measured by `saving`, or a checkpoint's meta.json)
        self.signum: int | None = None
        self.received_at: float | None = None
        self.step = 0  # the last step completed (for an abandoned step's report)
        self._saving = False
        self.abandoned: Preempted | None = None  # what `_abandon` raised (a library may replace it)
        self.control = Path(os.environ[CONTROL_DIR_ENV]) if os.environ.get(CONTROL_DIR_ENV) else None
        self._previous: dict[int, object] = {}
        self._previous_unraisable: Callable | None = None

    def __enter__(self) -> PreemptWatch:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers live on the main thread; tests running a loop in a thread
        for sig in PREEMPT_SIGNALS:
            previous = signal.getsignal(sig)
            if previous == signal.SIG_IGN and self.control is not None:
                continue  # our launcher handles it
            self._previous[sig] = previous
            signal.signal(sig, self._on_signal)
        self._previous_unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc) -> None:
        self.disarm()
        for sig, previous in self._previous.items():  # SIGALRM's too, when the grace timer was set
            signal.signal(sig, previous)
        self._previous.clear()
        if self._previous_unraisable is not None:
            sys.unraisablehook, self._previous_unraisable = self._previous_unraisable, None

    def _unraisable(self, unraisable) -> None:
        """The abandon landed where Python cannot raise (a GC or weakref callback, a __del__: CPython prints
        "Exception ignored" and goes on): raise it again at the next point that can, at once."""
        if self.abandoned is not None and unraisable.exc_value is self.abandoned:
            self._arm(1e-3)
            return
        (self._previous_unraisable or sys.__unraisablehook__)(unraisable)

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is not None:
            return  # handled once (Slurm's requeue sends SIGTERM after submitit's USR2)
        self.signum, self.received_at = signum, time.time()
        step_s = self.grace_s if self._saving else self.grace_s - self.save_s
        what = f"the save of step {self.step}" if self._saving else f"step {self.step + 1}"
        bound = (
            f" (at most {max(step_s, 0):.3g} s of a {self.grace_s:g} s budget)" if self.grace_s > 0 else ""
        )
        self.say(f"{signame(signum)} received: finishing {what}{bound}, then checkpoint and exit")
        if self.grace_s > 0:
            self._previous.setdefault(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
            signal.signal(signal.SIGALRM, self._abandon)
            self._arm(step_s)

    def _arm(self, seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))  # 0 would disarm

    def _abandon(self, signum: int, frame) -> None:
        self.abandoned = Preempted(signame(self.signum or signal.SIGTERM), self.step, abandoned=True,
                                   received_at=self.received_at, saving=self._saving)  # fmt: skip
        raise self.abandoned

    def disarm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, 0)

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Around a checkpoint save: after a signal it may run to the end of the budget (the step's own
        deadline left it `save_s`); its duration becomes `save_s`. Abandoned, it raises `Preempted` whatever
        the code it interrupted made of it (torch.save's writer raises RuntimeError "unexpected pos" over
        it, and torch.distributed.checkpoint's gathering drops that error's context)."""
        self._saving, start = True, time.monotonic()
        # a timer only where our SIGALRM handler is (this process got the signal; not a launcher's rank)
        if self.signum is not None and self.grace_s > 0:
            self._arm(self.received_at + self.grace_s - time.time())
        try:
            yield
        except BaseException as exc:
            if self.abandoned is not None and exc is not self.abandoned:
                raise self.abandoned from None
            raise
        finally:
            self._saving = False
            self.disarm()
            self.save_s = time.monotonic() - start

    def budget_warning(self) -> str | None:
        """One line when the last save took longer than the whole exit's budget (None: it fits)."""
        if self.grace_s <= 0 or self.save_s <= self.grace_s:
            return None
        return (f"warning: the last checkpoint save took {self.save_s:.1f} s, more than preempt_grace_s="
                f"{self.grace_s:g} s, the budget from a preemption signal to the exit: a preemption will end "
                "without a checkpoint; raise preempt_grace_s (within the scheduler's KillWait or "
                "signal_delay_s) or save less (save_hf_dtype=bfloat16)")  # fmt: skip

    def local_request(self) -> str | None:
        """This process' signal, else the launcher's request (a signal name), else None."""
        if self.signum is not None:
            return signame(self.signum)
        if self.control is not None:
            try:
                return json.loads((self.control / REQUEST).read_text())["signal"]
            except (OSError, ValueError, KeyError):
                return None
        return None

    def agreed_request(self) -> str | None:
        """Collective, once per step: the first signal any rank saw (all ranks get the same answer)."""
        from train.policy.distributed import all_gather_objects

        seen = [s for s in all_gather_objects(self.local_request()) if s]
        if seen and self.received_at is None:
            self.received_at = time.time()
        return seen[0] if seen else None


def write_outcome(stop: Preempted) -> None:
    """Under a launcher: tell it (its node's local rank 0 does) how the ranks stopped."""
    folder = os.environ.get(CONTROL_DIR_ENV)
    if folder and os.environ.get("LOCAL_RANK", "0") == "0":
        tmp = Path(folder) / f".{OUTCOME}.tmp"
        tmp.write_text(json.dumps(stop.as_dict()))
        tmp.replace(Path(folder) / OUTCOME)


def read_outcome(folder: Path) -> Preempted | None:
    try:
        return Preempted.from_dict(json.loads((folder / OUTCOME).read_text()))
    except (OSError, ValueError, KeyError):
        return None
