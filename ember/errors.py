"""Shared error types for every stage.

`Unsupported` is what a user sees when ember cannot compile something: it names the user's
file:line and the reason. `InternalError` marks a compiler bug; the fallback policy turns it into
eager execution with one warning unless EMBER_STRICT=1.
"""
from __future__ import annotations


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class Unsupported(EmberError):
    """A construct ember cannot compile. Carries the reason and, when known, the user location.

    Raised while tracing a frame's own bytecode, capture also sets `break_at` (instruction
    index, visit number) and `break_location`: where a graph break can resume; `no_break` says
    why a break could not be made there (the frame then runs eagerly)."""

    break_at: tuple | None = None
    break_location: str | None = None
    no_break: str | None = None     # why no resumable graph break could be made there

    def __init__(self, reason: str, *, location: str | None = None, source_line: str | None = None,
                 hint: str | None = None):
        self.reason = reason
        self.location = location
        self.source_line = source_line
        self.hint = hint
        parts = [f"{location}: {reason}" if location else reason]
        if source_line:
            parts.append(f"    {source_line.strip()}")
        if hint:
            parts.append(f"hint: {hint}")
        super().__init__("\n".join(parts))


class RecompileError(EmberError, RuntimeError):
    """A compiled frame would recompile under `ember.set_stance("fail_on_recompile")`; the
    message names the frame and the guard that failed."""


class InternalError(EmberError):
    """A bug in ember itself (a stage produced something the next stage cannot take)."""


class BackendCompilerFailed(EmberError):
    """A backend raised while compiling a graph; wraps the original exception."""

    def __init__(self, backend: str, stage: str, exc: BaseException):
        self.backend, self.stage, self.original = backend, stage, exc
        first = str(exc).splitlines()[0] if str(exc) else ""
        super().__init__(f"backend {backend!r} failed in {stage}: {type(exc).__name__}: {first}")
