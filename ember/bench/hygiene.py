"""CPU timing hygiene for ember bench: thread count, allocator, and the re-exec that applies them.

Consumes the user's choice (--threads, --allocator); produces a child environment and a record
of what was in force (printed and written into every JSON line). Why each knob matters:

- threads: torch's intra-op pool and the OpenMP pool of generated C++ kernels both read
  OMP_NUM_THREADS when the process starts, so it is set in the environment of a fresh process,
  and torch.set_num_threads() is called again inside it.
- allocator: glibc returns big freed buffers to the OS (mmap/trim), so every step page-faults
  them back in; eager LayerNorm+GELU on 16 MB swings 2-15 ms from that alone. The fix is
  MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ (read by glibc at start-up, hence the re-exec)
  or jemalloc/tcmalloc through LD_PRELOAD when one is installed.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
ALLOCATORS = ("auto", "glibc-tuned", "jemalloc", "tcmalloc", "system")
_CHILD_MARK = "EMBER_BENCH_CHILD"
_LIB_PATTERNS = {
    "jemalloc": ["libjemalloc.so*"],
    "tcmalloc": ["libtcmalloc.so*", "libtcmalloc_minimal.so*"],
}
_LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/lib64",
             "/usr/local/lib", "/lib/x86_64-linux-gnu"]


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def find_library(kind: str) -> str | None:
    for directory in _LIB_DIRS:
        for pattern in _LIB_PATTERNS[kind]:
            hits = sorted(glob.glob(os.path.join(directory, pattern)))
            if hits:
                return hits[0]
    return None


def resolve_allocator(choice: str) -> tuple[str, dict[str, str]]:
    """(name, env additions) for an --allocator choice; "auto" prefers jemalloc, tcmalloc, glibc."""
    if choice not in ALLOCATORS:
        raise ValueError(f"unknown allocator {choice!r}; valid: {', '.join(ALLOCATORS)}")
    if choice == "system":
        return "glibc-default", {}
    order = ["jemalloc", "tcmalloc"] if choice == "auto" else [choice] if choice != "glibc-tuned" else []
    for kind in order:
        lib = find_library(kind)
        if lib:
            return f"{kind} ({lib})", {"LD_PRELOAD": lib}
        if choice == kind:
            raise RuntimeError(f"--allocator {kind}: no lib{kind} found in {', '.join(_LIB_DIRS)}")
    return "glibc-tuned", dict(MALLOC_ENV)


def child_env(threads: int, allocator: str = "auto", strict: bool = False,
              base: dict | None = None) -> tuple[dict[str, str], str]:
    """The environment for a benchmark process and the allocator's name.

    EMBER_STRICT is removed unless `strict`: a benchmark measures what a user gets, and a backend
    fallback is detected from its warning and reported, not turned into a crash (pytest's
    conftest sets EMBER_STRICT=1, which would otherwise leak into every child).
    """
    env = dict(os.environ if base is None else base)
    name, extra = resolve_allocator(allocator)
    for key in list(MALLOC_ENV) + ["LD_PRELOAD"]:
        env.pop(key, None)
    env.update(extra)
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["EMBER_BENCH_THREADS"] = str(threads)
    env["EMBER_BENCH_ALLOCATOR"] = name
    env.setdefault("KINETO_LOG_LEVEL", "5")   # the memory profiler is chatty on stderr
    if strict:
        env["EMBER_STRICT"] = "1"
    else:
        env.pop("EMBER_STRICT", None)
    env[_CHILD_MARK] = "1"
    return env, name


def in_child() -> bool:
    return os.environ.get(_CHILD_MARK) == "1"


def reexec(argv: list[str], threads: int, allocator: str, strict: bool = False) -> int | None:
    """Run `python -m ember.bench argv` again with the hygiene env, unless this is that run.

    Returns the child's exit code, or None when this process already has the env (go on).
    A child process rather than os.execv so that calling main() from Python stays safe.
    """
    if in_child():
        return None
    env, _ = child_env(threads, allocator, strict)
    cmd = [sys.executable, "-m", "ember.bench", *argv]
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


def apply_threads(threads: int | None = None) -> int:
    """Set torch's thread count in this process (from --threads or the env the parent set)."""
    import torch
    n = threads or int(os.environ.get("EMBER_BENCH_THREADS") or 0) or default_threads()
    torch.set_num_threads(n)
    return n


def describe() -> dict:
    """What is in force in this process: recorded with every result."""
    import torch
    allocator = os.environ.get("EMBER_BENCH_ALLOCATOR")
    if not allocator:
        if "jemalloc" in os.environ.get("LD_PRELOAD", ""):
            allocator = "jemalloc"
        elif "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
            allocator = "tcmalloc"
        elif os.environ.get("MALLOC_MMAP_THRESHOLD_"):
            allocator = "glibc-tuned"
        else:
            allocator = "glibc-default"
    return {
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "allocator": allocator,
        "malloc_env": {k: os.environ[k] for k in MALLOC_ENV if k in os.environ},
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "strict": os.environ.get("EMBER_STRICT", ""),
    }
