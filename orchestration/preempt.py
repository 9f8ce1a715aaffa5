"""The launcher's side of preemption: what the process that started the ranks (or the sweep job) does
when the cluster takes the machine away. The ranks' side (the signal watch at the step boundary, the
control folder's files) is train/preemption.py's; this module writes the request the ranks read there,
keeps SIGUSR2 away from torchrun and its ranks, and hands a finished stop to submitit's requeue hook.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from train.preemption import PREEMPT_SIGNALS, REQUEST, Preempted, signame


def ignore_preempt_usr2() -> None:
    """preexec_fn of torchrun: SIGUSR2 ignored there and in the ranks (inherited through exec)."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


@contextlib.contextmanager
def forward_to_ranks(folder: Path, say: Callable[[str], None] = print) -> Iterator[dict]:
    """The launcher's side: while its ranks run, SIGTERM / SIGUSR2 write the ranks' request (once).
    Yields a dict that gets `signal` and `received_at` when one came."""
    seen: dict = {}

    def on_signal(signum: int, frame) -> None:
        if seen:
            return
        seen.update(signal=signame(signum), received_at=time.time())
        say(f"{signame(signum)} received by the launcher: the ranks finish their step, checkpoint and exit")
        tmp = folder / f".{REQUEST}.tmp"
        tmp.write_text(json.dumps(seen))
        tmp.replace(folder / REQUEST)

    if threading.current_thread() is not threading.main_thread():
        yield seen  # handlers live on the main thread (tests start 'nodes' in threads)
        return
    previous = {sig: signal.getsignal(sig) for sig in PREEMPT_SIGNALS}
    for sig in PREEMPT_SIGNALS:
        signal.signal(sig, on_signal)
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def hand_to_scheduler(stop: Preempted) -> None:
    """After the checkpoint: give a SIGUSR2 to the handler that was there before ours (submitit's
    checkpoint-and-requeue hook, inside a sweep job), which requeues the job and exits."""
    if stop.signame != "SIGUSR2":
        return
    handler = signal.getsignal(signal.SIGUSR2)
    if callable(handler):
        handler(signal.SIGUSR2, None)
