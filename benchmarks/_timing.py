"""Timing helpers shared by the focused scripts in benchmarks/ (cpu_kernels.py, op_sweep.py).

- `prepare()`: re-executes the script once with the allocator kept from returning big buffers to
  the OS (ember.bench.hygiene.MALLOC_ENV; glibc reads it at start-up, hence the re-exec), points
  ember's and Inductor's caches at a fresh temporary directory (cold compiles), and puts the repo
  root first on sys.path (a script path puts benchmarks/ there instead).
- `competing_load(n)`: n processes looping a one-thread matmul while a block runs (the
  stability scripts' "load" condition).
- `paired(fns, args, rounds)`: each callable once per round, order reversed every other round
  (A B C, C B A, ...), so drift from other load on the machine hits every callable alike; returns
  the per-round seconds per call of each, for medians and per-round ratios. With one intra-op
  thread the seconds are the calling thread's CPU time (time_call).
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare() -> str:
    """Re-exec with the allocator env unless present; temporary caches; repo root on sys.path."""
    if ROOT not in sys.path[:1]:
        sys.path.insert(0, ROOT)
    from ember.bench.hygiene import MALLOC_ENV
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.environ.update(MALLOC_ENV)
        os.execv(sys.executable, [sys.executable] + sys.argv)
    tmp = tempfile.mkdtemp(prefix="ember-bench-")
    os.environ.setdefault("EMBER_CACHE_DIR", os.path.join(tmp, "ember"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tmp, "inductor"))
    return tmp


def time_call(fn, args=(), reps: int = 1) -> float:
    """Seconds per call of fn(*args), averaged over `reps` back-to-back calls: the calling
    thread's CPU time with one intra-op thread (steady on a loaded box), else wall time (the
    clock of ember's speed check and of `ember bench`)."""
    from ember.backends.paired import step_clock
    clock = step_clock()
    t0 = clock()
    for _ in range(reps):
        fn(*args)
    return (clock() - t0) / reps


def pick_reps(fn, args=(), target_s: float = 0.05, cap: int = 50) -> int:
    """Calls per round so that one round of `fn` takes about `target_s`; from the fastest of 3
    calls (on a loaded machine one call can lose a 4 ms scheduler slice)."""
    t = min(time_call(fn, args, 1) for _ in range(3))
    return max(1, min(cap, int(target_s / max(t, 1e-6))))


def paired(fns: dict, args=(), rounds: int = 11, reps: int | None = None,
           target_s: float = 0.05) -> tuple[dict[str, list[float]], int]:
    """Per-round seconds per call of each callable, in alternating order; and the reps used.

    Reps are chosen from the first callable (the baseline) when not given."""
    order = list(fns)
    if reps is None:
        reps = pick_reps(fns[order[0]], args, target_s)
    samples: dict[str, list[float]] = {k: [] for k in order}
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            samples[k].append(time_call(fns[k], args, reps))
    return samples, reps


def ratio_stats(base: list[float], other: list[float]) -> dict:
    """Speed of `other` relative to `base` (base time / other time): of the medians, and the
    median, quartiles and range of the per-round ratios (the spread over repetitions)."""
    per = sorted(b / o for b, o in zip(base, other))
    q = statistics.quantiles(per, n=4, method="inclusive") if len(per) >= 2 else [per[0]] * 3
    return {"of_medians": statistics.median(base) / statistics.median(other),
            "median": statistics.median(per), "p25": q[0], "p75": q[2],
            "min": per[0], "max": per[-1]}


def _burn(stop):
    import torch
    torch.set_num_threads(1)
    a = torch.randn(1024, 1024)
    while not stop.is_set():
        a @ a


@contextlib.contextmanager
def competing_load(n: int):
    """`n` processes, each looping a one-thread 1024^3 matmul (competing for the cores, the L3
    and memory bandwidth), while the block runs; started a second before it."""
    import multiprocessing as mp
    stop = mp.Event()
    procs = [mp.Process(target=_burn, args=(stop,)) for _ in range(n)]
    for p in procs:
        p.start()
    if procs:
        time.sleep(1.0)
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join()
