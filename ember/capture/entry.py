"""Capture entry points (placeholder until the bytecode interpreter lands).

Runs the program eagerly and says so once: never a silent fallback.
"""
from __future__ import annotations

from ..config import CompileSettings
from ..logging import warn_once


def _eager_with_warning(fn, settings: CompileSettings, what: str):
    def run(*args, **kwargs):
        warn_once(f"capture-missing:{what}",
                  f"capture is not implemented yet; {what} runs eagerly "
                  f"(backend {settings.backend_name!r} unused)")
        return fn(*args, **kwargs)
    return run


def compile_function(fn, settings: CompileSettings):
    return _eager_with_warning(fn, settings, getattr(fn, "__qualname__", repr(fn)))


def compile_module(module, settings: CompileSettings):
    return _eager_with_warning(module._call_impl, settings, type(module).__qualname__)


def reset() -> None:
    """Drop every capture cache."""


def explain(fn, *args, **kwargs):
    raise NotImplementedError("ember.explain needs the capture stage")
