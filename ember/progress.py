"""A live one-line progress display for long compiles (`ember: compiling graph 2 · codegen · 3.1 s`).

Shown only on a TTY, only once a compile has run longer than `DELAY` seconds, and never when
EMBER_PROGRESS=0. Stages report where they are with `stage("codegen")`; the line is erased when
the compile ends, so nothing is left in logs or captured output.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time

from . import config

DELAY = 1.0
_current: contextvars.ContextVar = contextvars.ContextVar("ember_progress", default=None)
_graphs = 0
_lock = threading.Lock()


class _Line:
    def __init__(self, graph: int, stream):
        self.graph, self.stream, self.stage_name = graph, stream, "start"
        self.start = time.perf_counter()
        self.shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def text(self) -> str:
        return f"ember: compiling graph {self.graph} · {self.stage_name} · {time.perf_counter() - self.start:.1f} s"

    def _loop(self):
        if self._stop.wait(DELAY):
            return
        while not self._stop.is_set():
            self.stream.write("\r" + self.text() + "\033[K")
            self.stream.flush()
            self.shown = True
            self._stop.wait(0.2)

    def close(self):
        self._stop.set()
        self._thread.join()
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def enabled(stream=None) -> bool:
    stream = stream or sys.stderr
    return config.progress() and hasattr(stream, "isatty") and stream.isatty()


@contextlib.contextmanager
def compiling(stream=None):
    """Wrap one graph's compile. Nested compiles (backward inside forward) reuse the outer line."""
    global _graphs
    stream = stream or sys.stderr
    if _current.get() is not None or not enabled(stream):
        yield
        return
    with _lock:
        _graphs += 1
        n = _graphs
    line = _Line(n, stream)
    token = _current.set(line)
    try:
        yield
    finally:
        _current.reset(token)
        line.close()


def stage(name: str) -> None:
    """Tell the live line which stage is running (no-op when no line is shown)."""
    line = _current.get()
    if line is not None:
        line.stage_name = name
