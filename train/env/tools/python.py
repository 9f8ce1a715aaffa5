"""The `python` tool: runs the model's code in the sandbox (train/env/sandbox.py) and returns what it printed.

Why a tool and not the sandbox itself: the model needs one string back. A clean run returns stdout, then
stderr under a "stderr:" line when there is any; a non-zero exit, a crash or a kill (wall time, CPU time,
output cap) is a ToolError whose message is the reason and the (truncated) output, so the model sees what
went wrong, e.g. "killed: wall time 5 s exceeded". The limits are this tool's keywords, set per config.
The sandbox's mechanism is decided when the tool is built, so a machine where nothing isolates the program
stops the run at its start with one line naming the opt-in (`mechanism: rlimits`), not at every call.
"""

from __future__ import annotations

from typing import Any

from train.env import sandbox
from train.env.base import ToolError, one_argument_schema


class PythonTool:
    name = "python"

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_bytes: int = 8192,
        cpu_s: int | None = None,
        max_procs: int = 16,
        file_mb: int = 16,
        disk_mb: int = 64,
        mechanism: str = "auto",
    ) -> None:
        if mechanism not in sandbox.MECHANISMS:
            raise ValueError(
                f"python tool mechanism={mechanism!r}: expected one of {', '.join(sandbox.MECHANISMS)}"
            )
        cpu = cpu_s if cpu_s is not None else max(1, round(timeout_s))
        self.limits = sandbox.Limits(
            wall_s=timeout_s,
            cpu_s=cpu,
            memory_mb=memory_mb,
            max_procs=max_procs,
            file_mb=file_mb,
            disk_mb=disk_mb,
            max_output_bytes=max_output_bytes,
        )
        self.mechanism = mechanism
        self.offline = sandbox.choose(mechanism).name != "rlimits"  # rlimits leaves the network reachable

    def schema(self) -> dict[str, Any]:
        limits, network = self.limits, "no network, " if self.offline else ""
        return one_argument_schema(
            self.name,
            f"Run a Python 3 program (standard library only, {network}no input) and return "
            f"what it prints. Use print() to see results. Limits: {limits.wall_s:g} s, "
            f"{limits.memory_mb} MB, {limits.max_output_bytes} bytes of output.",
            "code",
            "the program's source",
        )

    def __call__(self, code: Any = None, **extra: Any) -> str:
        if extra:
            raise ToolError(f"python: unexpected argument(s) {', '.join(sorted(extra))}; pass only code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError('python: missing "code" (a string holding a Python program)')
        result = sandbox.run(code, self.limits, self.mechanism)
        output = result.stdout
        if result.stderr:
            output += ("\n" if output and not output.endswith("\n") else "") + f"stderr:\n{result.stderr}"
        if result.ok:
            return output or "(no output: print() what you want to see)"
        head = f"killed: {result.reason}" if result.killed else f"error: {result.reason}"
        raise ToolError(f"{head}\n{output}" if output else head)
