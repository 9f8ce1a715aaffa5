"""The C memory allocator of every process the project starts: `RLPOST_ALLOCATOR=tcmalloc|jemalloc|glibc|off`.

Why: a training step frees and re-allocates the same large tensors (activations, logits, gradients) every
step. glibc's malloc serves blocks above its mmap threshold with fresh `mmap`s and returns them with
`munmap`, and trims the heap top back to the kernel, so every step faults its memory in again (the first
CI machine: 57 M minor page faults and 267 s of system time in a 12-minute bench). Both fixes keep the
memory in the process:

- `tcmalloc`: gperftools' tcmalloc (Debian's `libtcmalloc-minimal4`), preloaded (`LD_PRELOAD`):
  it keeps freed pages in its caches; vLLM's CPU backend asks for it too. `make setup` installs it where
  apt is available; where the library is missing the process says so in one line and falls back to `glibc`.
- `jemalloc`: Debian's `libjemalloc2`, preloaded, freed pages never decayed (measured: more faults than
  tcmalloc and tuned glibc on this workload, kept for machines where it measures better).
- `glibc` (default): glibc's own malloc told never to `mmap` and never to trim (`MALLOC_MMAP_MAX_=0`,
  `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`; set by `mallopt` in the running process, by environment
  for its children).
- `off`: the platform's malloc with its defaults (the settings above removed from the environment).

`ensure()` is called first thing by each entry point (`python -m train`, the sweep, the pipeline, the
benches, the evals): a preloaded allocator must be in place before the interpreter starts, so the entry
point re-executes itself once with `LD_PRELOAD` set. Children (torchrun ranks, sweep jobs, vLLM's engine
process, the bench workers) inherit the environment. `python -m infra.allocator CMD ...` runs any command
under it (what `make test` does).

Measured (`make bench-profile`, one bf16 step of 8 prompts x 4 samples x 64 tokens, 2 cores, load ~1.7):
step / update system time / update minor faults: off 9.63 s / 2.57 s / 1.69 M, glibc 8.70 s / 0.40 s / 241 k,
tcmalloc 8.13 s / 0.43 s / 296 k, jemalloc 8.68 s / 1.05 s / 308 k. An earlier run at 2 prompts x 4 x 32
tokens under load ~5 saw tcmalloc slow vLLM's CPU rollout 40x (0.78 -> 33 s); hence glibc (tuned, no
package, set in-process by `mallopt`) is the default: it takes most of the gain without that risk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

MODES = ("tcmalloc", "jemalloc", "glibc", "off")
DEFAULT = "glibc"
ENV = "RLPOST_ALLOCATOR"
_REEXEC_MARK = "RLPOST_ALLOCATOR_EXEC"  # set by the re-exec so a failed preload cannot loop

# mode -> (shared library, Debian package)
PRELOADED = {
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
}
# freed pages never decay back to the kernel; no separate arena (with immediate decay) for large blocks
JEMALLOC_CONF = (
    "oversize_threshold:0,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
)
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
    """The mode asked for by `RLPOST_ALLOCATOR` (default `glibc`)."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower() or DEFAULT
    if value not in MODES:
        raise AllocatorError(f"{ENV}={value!r}: expected one of {', '.join(MODES)} (unset means {DEFAULT})")
    return value


def find_library(mode: str) -> str | None:
    """Path of `mode`'s shared library (tcmalloc | jemalloc), or None when it is not installed."""
    if mode not in PRELOADED:
        return None
    lib = PRELOADED[mode][0]
    for d in _LIB_DIRS:
        if (Path(d) / lib).is_file():
            return str(Path(d) / lib)
    name = ctypes.util.find_library(lib.split(".so")[0].removeprefix("lib"))
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
    if lib == "tcmalloc":
        return "tcmalloc (preloaded)"
    tuned = all(os.environ.get(k) == v for k, v in GLIBC_ENV.items())
    return "glibc (no mmap, no trim)" if tuned else "glibc (defaults)"


def child_env(mode: str, environ: dict[str, str], library: str | None) -> dict[str, str]:
    """`environ` with `mode`'s settings (`library`: its preloaded .so, None when missing): what every
    process started from it inherits. Pure."""
    env = dict(environ)
    env[ENV] = mode
    others = {name for name, _ in PRELOADED.values()}  # one allocator at a time
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and Path(p).name not in others]
    if mode in PRELOADED and library:
        env["LD_PRELOAD"] = ":".join([library, *preload])
        if mode == "jemalloc":
            env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
        for key in GLIBC_ENV:
            env.pop(key, None)
        return env
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    if env.get("MALLOC_CONF") == JEMALLOC_CONF:
        env.pop("MALLOC_CONF")
    if mode == "off":
        for key, value in GLIBC_ENV.items():
            if env.get(key) == value:
                env.pop(key)
    else:  # glibc, or a preloaded allocator whose library is missing
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

    With `reexec`, a process that should run under a preloaded allocator but does not re-executes itself once
    (`sys.orig_argv`) with it preloaded; call this before anything else in an entry point's `__main__`.
    """
    try:
        mode = requested()
    except AllocatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if mode == "off":
        os.environ.update(child_env(mode, dict(os.environ), None))
        return describe()
    library = find_library(mode)
    if mode in PRELOADED and not library:
        lib, package = PRELOADED[mode]
        print(
            f"[allocator] {lib} not found (`make setup` installs {package} with apt): "
            f"using glibc malloc without mmap/trim instead; {ENV}=glibc silences this",
            file=sys.stderr,
        )
    env = child_env(mode, dict(os.environ), library)
    if mode in PRELOADED and library and loaded_allocator() != mode:
        if reexec and not os.environ.get(_REEXEC_MARK) and getattr(sys, "orig_argv", None):
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**env, _REEXEC_MARK: "1"})
        _tune_glibc_here()  # could not preload here: the children still get the preloaded allocator
    elif loaded_allocator() == "glibc":
        _tune_glibc_here()
    os.environ.clear()
    os.environ.update(env)
    os.environ.pop(_REEXEC_MARK, None)
    return describe()


def main(argv: list[str] | None = None) -> int:
    """`python -m infra.allocator CMD [ARG ...]`: run CMD under the requested allocator."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m infra.allocator CMD [ARG ...]   ({ENV}={'|'.join(MODES)})")
        return 0 if argv else 2
    ensure(reexec=False)
    os.execvpe(argv[0], argv, dict(os.environ))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
