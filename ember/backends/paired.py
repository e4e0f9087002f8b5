"""Backend "ember": the statistics of choices made by timing two ways to compute one thing on a
shared machine (speed.py: a graph's kernels or eager PyTorch; gemmlib.py: which GEMM library).

Clock (`step_clock`): with one intra-op thread a call is timed in the calling thread's CPU
time, which other processes do not inflate (time preempted is not counted); with several
threads in wall time (their work runs in other threads, whose spin-waits CPU time would count).

Statistic (`ratios`): the two ways run in paired rounds, the order reversed every other round;
each round gives one time ratio, and the answer is the median of those ratios, with their
spread q3/q1 (the interquartile ratio) and the median's ~95% interval (order statistics, as
the sign test's: it narrows as rounds are added, however wide single rounds spread). Load on
the machine (other processes' memory traffic, preemption) moves single calls by tens of
percent and comes in bursts longer than a call: a minimum time per way, taken in different
rounds, compares one way's quiet moment with the other's busy one and flipped verdicts between
processes (docs/design/083, 090); a ratio within one round compares two calls under the same
load, and a median ignores the odd round. A timing that cannot decide (gemmlib: its spread
too wide; speed: its median's interval holds the margin) is timed again; none deciding, the
caller falls back to its conservative answer and caches it marked unsure (`store`) for
UNSURE_TTL, so that another process (a warm start) reads the same answer instead of timing
again and deciding otherwise; after UNSURE_TTL a process times again.

Consumes: per-round times. Produces: Ratios; cached answers (JSON dicts).
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import torch

from .. import config

#: seconds an unsure answer stays cached before a process times again
UNSURE_TTL = 24 * 3600


def step_clock():
    """The timer for a round (module docstring, Clock)."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


@dataclasses.dataclass(frozen=True)
class Ratios:
    """The per-round ratios a/b of paired rounds, sorted."""
    r: tuple[float, ...]

    @property
    def rounds(self) -> int:
        return len(self.r)

    @property
    def median(self) -> float:
        return statistics.median(self.r)

    @property
    def spread(self) -> float:
        """q3/q1."""
        n = len(self.r)
        return self.r[3 * n // 4] / max(self.r[n // 4], 1e-12)

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """The median's interval at z standard errors (1.96: ~95%): the order statistics
        n/2 -+ z sqrt(n)/2, as the sign test's; it narrows as rounds are added."""
        n = len(self.r)
        k = max(0, math.floor(n / 2 - z * math.sqrt(n) / 2))
        return self.r[k], self.r[n - 1 - k]


def ratios(a: list[float], b: list[float]) -> Ratios:
    return Ratios(tuple(sorted(x / max(y, 1e-12) for x, y in zip(a, b))))


def load(path: Path, keys: tuple = ()) -> dict | None:
    """A cached answer (a JSON object holding every one of `keys`), or None: none there,
    unreadable, not such an object, or unsure and older than UNSURE_TTL."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or any(k not in data for k in keys) or \
                not data.get("sure", True) and time.time() - path.stat().st_mtime > UNSURE_TTL:
            return None
        return data
    except (OSError, ValueError):
        return None


def store(path: Path, data: dict, sure: bool) -> None:
    config.write_json(path, {**data, "sure": sure})
