"""EMBER_DEBUG_DIR: every compile writes each stage's IR as a readable file.

Layout: `$EMBER_DEBUG_DIR/graph_<n>/<k>_<stage>.<ext>`, one folder per compiled frame (capture
opens the scope; a graph handed to a backend from elsewhere opens its own), files numbered in the
order the stages ran:

    graph_1/01_capture.py         the FX graph capture hands to the backend
            02_aot_forward.py     aot's forward and backward aten graphs
            03_aot_backward.py
            04_lower.py           the forward's loop IR, schedule, C++ and wrapper
            05_schedule.py
            06_kernels.cpp
            07_wrapper.py
            08_guards.py          the cache entry's guards and run function (capture)
            09_backward_lower.py  the backward, compiled at the first backward call, joins its
            ...                   forward's folder (`resume` with a prefix)

Each file starts with a header line `# after <stage>: <summary>` (`//` for C++), or is a printed
IR that starts with its own header (`summary=None`). Stages call `dump(stage, text, summary=...)`;
an artifact passed as `of=` is written once per scope (the aten graph aot dumps is the one the
kernel backend gets). Outside a scope (or without EMBER_DEBUG_DIR) dumping does nothing.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from pathlib import Path

from . import config

_scope: contextvars.ContextVar = contextvars.ContextVar("ember_debug_scope", default=None)
_graph_ids = itertools.count(1)
_lock = threading.Lock()


class _Scope:
    def __init__(self, folder: Path, files=None, prefix: str = "", written=None):
        self.folder, self.prefix = folder, prefix
        self.files = files if files is not None else itertools.count(1)
        self.written = written if written is not None else set()   # ids of artifacts dumped


@contextlib.contextmanager
def graph_scope():
    """One folder per compiled graph; nested scopes (a backward graph) reuse the outer folder."""
    root = config.debug_dir()
    if root is None or _scope.get() is not None:
        yield
        return
    with _lock:
        n = next(_graph_ids)
    token = _scope.set(_Scope(root / f"graph_{n}"))
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> _Scope | None:
    """The open scope, for a later stage (a lazily compiled backward) to `resume`."""
    return _scope.get()


@contextlib.contextmanager
def resume(scope: _Scope | None, prefix: str):
    """Dump into `scope`'s folder again (numbering goes on), each stage name prefixed."""
    if scope is None or _scope.get() is not None:
        yield
        return
    token = _scope.set(_Scope(scope.folder, scope.files, prefix, scope.written))
    try:
        yield
    finally:
        _scope.reset(token)


def dump(stage: str, text: str, *, summary: str | None = "", ext: str = "py",
         of: object = None) -> Path | None:
    scope = _scope.get()
    if scope is None:
        return None
    if of is not None:
        if id(of) in scope.written:
            return None
        scope.written.add(id(of))
    scope.folder.mkdir(parents=True, exist_ok=True)
    stage = scope.prefix + stage
    path = scope.folder / f"{next(scope.files):02d}_{stage}.{ext}"
    comment = "//" if ext in ("cpp", "c", "h") else "#"
    part = f" ({scope.prefix.rstrip('_')})" if scope.prefix else ""
    header = "" if summary is None else f"{comment} after {stage[len(scope.prefix):]}{part}: {summary}\n"
    path.write_text(header + text)
    return path


def active() -> bool:
    """Is a dump being written? (Printing an IR costs time: print only when it is.)"""
    return _scope.get() is not None
