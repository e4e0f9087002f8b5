"""EMBER_DEBUG_DIR: every compile writes each stage's IR as a readable file.

Layout: `$EMBER_DEBUG_DIR/graph_<n>/<k>_<stage>.<ext>`, one folder per graph handed to a backend,
files numbered in the order the stages ran (a backward graph compiled later joins its forward's
folder when compiled inside the same scope). Each file starts with a header line
`# after <stage>: <summary>` (`//` for C++), or is a printed IR that starts with its own header
(`summary=None`). Stages call `dump(stage, text, summary=...)`; outside a graph scope (or without
EMBER_DEBUG_DIR) it does nothing.
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
    def __init__(self, folder: Path):
        self.folder = folder
        self.files = itertools.count(1)


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


def current_folder() -> Path | None:
    scope = _scope.get()
    return scope.folder if scope else None


def dump(stage: str, text: str, *, summary: str | None = "", ext: str = "py") -> Path | None:
    scope = _scope.get()
    if scope is None:
        return None
    scope.folder.mkdir(parents=True, exist_ok=True)
    path = scope.folder / f"{next(scope.files):02d}_{stage}.{ext}"
    comment = "//" if ext in ("cpp", "c", "h") else "#"
    header = "" if summary is None else f"{comment} after {stage}: {summary}\n"
    path.write_text(header + text)
    return path


def active() -> bool:
    """Is a dump being written? (Printing an IR costs time: print only when it is.)"""
    return _scope.get() is not None
