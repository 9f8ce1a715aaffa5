"""How every entry point of the project ends its process: stdio flushed, then `os._exit`, no interpreter teardown.

Why: C++ threads outlive Python's finalization. gloo's worker threads free the tensors of finished
collectives (a tensor whose Python object C++ owns takes the GIL to be freed), FSDP2's device mesh keeps
its process groups alive until module teardown, and vLLM's in-process engine leaves non-daemon threads
behind. A thread that touches a finalizing interpreter is unwound by it, and the C++ runtime aborts the
process ("terminate called without an active exception", SIGABRT) after its work has succeeded: a rank of a
2-rank gloo test did so in CI, and torchrun then failed the whole job. Results must already be on disk
(files closed) when this is called.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_now(code: int = 0) -> NoReturn:
    """Flush stdout and stderr and end the process with `code`, skipping the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced streams: nothing left to lose
            pass
    os._exit(code)
