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


@contextlib.contextmanager
def timed(stage: str):
    """Add the wall time of the block to `compile_seconds[stage]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        with _lock:
            _seconds[stage] += time.perf_counter() - start


def snapshot() -> dict:
    with _lock:
        return {"counts": dict(_counts), "compile_seconds": dict(_seconds)}


def clear() -> None:
    with _lock:
        _counts.clear()
        _seconds.clear()
