"""The exception a preempted run ends with, and finding it inside other exceptions.

Below train/launch/ (which handles the signals) because the checkpoint writer needs it too: a save
abandoned past the preemption budget surfaces wrapped in the checkpoint library's own exceptions, and must
still end the run as preempted (KILLED), not as failed.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator


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
