"""The C memory allocator of every process the project starts: `RLPOST_ALLOCATOR=jemalloc|glibc|off`.

Why: a training step frees and re-allocates the same large tensors (activations, logits, gradients) every
step. glibc's malloc serves blocks above its mmap threshold with fresh `mmap`s and returns them with
`munmap`, and trims the heap top back to the kernel, so every step faults its memory in again (the first
CI machine: 57 M minor page faults and 267 s of system time in a 12-minute bench). Both fixes keep the
memory in the process:

- `jemalloc` (default): Debian's `libjemalloc2`, preloaded (`LD_PRELOAD`) with a 30 s decay, so freed
  pages are reused instead of returned. `make setup` installs it where apt is available; where the
  library is missing the process says so in one line and falls back to `glibc`.
- `glibc`: glibc's own malloc told never to `mmap` and never to trim (`MALLOC_MMAP_MAX_=0`,
  `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`; set by `mallopt` in the running process, by environment
  for its children).
- `off`: whatever the environment gives (the platform's malloc as configured by the user).

`ensure()` is called first thing by each entry point (`python -m train`, the sweep, the pipeline, the
benches, the evals): a preloaded allocator must be in place before the interpreter starts, so the entry
point re-executes itself once with `LD_PRELOAD` set. Children (torchrun ranks, sweep jobs, vLLM's engine
process, the bench workers) inherit the environment. `python -m train.allocator CMD ...` runs any command
under it (what `make test` does). `bench/profile_step.py` measured the choice (README, "Memory
allocator").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

MODES = ("jemalloc", "glibc", "off")
DEFAULT = "jemalloc"
ENV = "RLPOST_ALLOCATOR"
_REEXEC_MARK = "RLPOST_ALLOCATOR_EXEC"  # set by the re-exec so a failed preload cannot loop

JEMALLOC_LIB = "libjemalloc.so.2"
# PyTorch's CPU tuning guide's settings: background purging, a 30 s decay before freed pages go back.
JEMALLOC_CONF = "background_thread:true,metadata_thp:auto,dirty_decay_ms:30000,muzzy_decay_ms:30000"
# glibc: never mmap (every block from the heap), never trim, grow the heap 256 MiB at a time.
GLIBC_ENV = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
    "MALLOC_TOP_PAD_": str(256 << 20),
}
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4  # <malloc.h>
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib")


class AllocatorError(ValueError):
    pass


def requested(environ: dict[str, str] | None = None) -> str:
    """The mode asked for by `RLPOST_ALLOCATOR` (default `jemalloc`)."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower() or DEFAULT
    if value not in MODES:
        raise AllocatorError(f"{ENV}={value!r}: expected one of {', '.join(MODES)} (unset means {DEFAULT})")
    return value


def find_jemalloc() -> str | None:
    """Path of the jemalloc shared library, or None when it is not installed."""
    for d in _LIB_DIRS:
        if (Path(d) / JEMALLOC_LIB).is_file():
            return str(Path(d) / JEMALLOC_LIB)
    name = ctypes.util.find_library("jemalloc")
    return name if name and Path(name).is_absolute() else None


def loaded_allocator() -> str:
    """What serves malloc in this process: jemalloc | tcmalloc (seen in its memory maps) | glibc."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc"
    for name in ("jemalloc", "tcmalloc"):
        if f"lib{name}" in maps:
            return name
    return "glibc"


def describe() -> str:
    """One line for logs and bench tables: the allocator running this process and its settings."""
    lib = loaded_allocator()
    if lib == "jemalloc":
        return f"jemalloc ({os.environ.get('MALLOC_CONF', 'default conf')})"
    if lib != "glibc":
        return lib
    tuned = all(os.environ.get(k) == v for k, v in GLIBC_ENV.items())
    return "glibc (no mmap, no trim)" if tuned else "glibc (defaults)"


def child_env(mode: str, environ: dict[str, str], jemalloc: str | None) -> dict[str, str]:
    """`environ` with `mode`'s settings: what every process started from it inherits. Pure."""
    env = dict(environ)
    env[ENV] = mode
    if mode == "jemalloc" and jemalloc:
        preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != jemalloc]
        env["LD_PRELOAD"] = ":".join([jemalloc, *preload])
        env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
        for key in GLIBC_ENV:
            env.pop(key, None)
    elif mode == "glibc" or (mode == "jemalloc" and not jemalloc):
        env.update(GLIBC_ENV)
    return env


def _tune_glibc_here() -> None:
    """The `glibc` settings in the running process (its environment was read when it started)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1))
        libc.mallopt(_M_TOP_PAD, ctypes.c_int(256 << 20))
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        pass


def ensure(reexec: bool = True) -> str:
    """Put this process and its future children under the requested allocator; returns what is in use.

    With `reexec`, a process that should run under jemalloc but does not re-executes itself once
    (`sys.orig_argv`) with it preloaded; call this before anything else in an entry point's `__main__`.
    """
    try:
        mode = requested()
    except AllocatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if mode == "off":
        return describe()
    jemalloc = find_jemalloc() if mode == "jemalloc" else None
    if mode == "jemalloc" and not jemalloc:
        print(
            f"[allocator] {JEMALLOC_LIB} not found (`make setup` installs libjemalloc2 with apt): "
            f"using glibc without mmap/trim instead; {ENV}=off silences this",
            file=sys.stderr,
        )
    env = child_env(mode, dict(os.environ), jemalloc)
    if mode == "jemalloc" and jemalloc and loaded_allocator() != "jemalloc":
        if reexec and not os.environ.get(_REEXEC_MARK) and getattr(sys, "orig_argv", None):
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**env, _REEXEC_MARK: "1"})
        _tune_glibc_here()  # could not preload here: the children still get jemalloc
    elif loaded_allocator() == "glibc":
        _tune_glibc_here()
    os.environ.clear()
    os.environ.update(env)
    os.environ.pop(_REEXEC_MARK, None)
    return describe()


def main(argv: list[str] | None = None) -> int:
    """`python -m train.allocator CMD [ARG ...]`: run CMD under the requested allocator."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m train.allocator CMD [ARG ...]   (RLPOST_ALLOCATOR=jemalloc|glibc|off)")
        return 0 if argv else 2
    ensure(reexec=False)
    os.execvpe(argv[0], argv, dict(os.environ))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
