"""Process-wide counters behind `ember.stats()`: graphs, breaks, recompiles, fallbacks, cache
hits, compile seconds per stage. Every stage may bump them; nothing reads them on a hot path."""
from __future__ import annotations

import collections
import contextlib
import threading
import time

_lock = threading.Lock()
_counts: collections.Counter = collections.Counter()
_seconds: collections.defaultdict = collections.defaultdict(float)


def bump(name: str, n: int = 1) -> None:
    with _lock:
        _counts[name] += n


_local = threading.local()


@contextlib.contextmanager
def timed(stage: str):
    """Add the wall time of the block to `compile_seconds[stage]`, less the time of `timed`
    blocks nested in it (so aot's figure excludes the codegen it calls into): the stages' figures
    add up to the total."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(0.0)                 # time spent in nested timed blocks
    start = time.perf_counter()
    try:
        yield
    finally:
        total = time.perf_counter() - start
        nested = stack.pop()
        if stack:
            stack[-1] += total
        with _lock:
            _seconds[stage] += total - nested


def snapshot() -> dict:
    with _lock:
        return {"counts": dict(_counts), "compile_seconds": dict(_seconds)}


def clear() -> None:
    with _lock:
        _counts.clear()
        _seconds.clear()
