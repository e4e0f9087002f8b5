"""Capture, controls: process-wide switches the interpreter core reads while tracing.

The scoped fullgraph of `ember.error_on_graph_break` (a ContextVar) and whether global
nn.Module hooks are registered. They live below both the interpreter (calls.py asks them while
tracing a call) and the cache layer (entry.py), so neither imports the other for them.
"""
from __future__ import annotations

import contextvars

import torch

from ..config import CompileSettings

# scoped fullgraph: a graph break in a frame compiled inside `with ember.error_on_graph_break(True)`
ERROR_ON_BREAK: contextvars.ContextVar = contextvars.ContextVar("ember_error_on_graph_break",
                                                                 default=False)


def fullgraph(settings: CompileSettings) -> bool:
    """Is a graph break an error here: fullgraph=True, or inside error_on_graph_break(True)."""
    return settings.fullgraph or ERROR_ON_BREAK.get()


_mm = torch.nn.modules.module


def global_hooks_present() -> bool:
    return bool(_mm._global_forward_hooks or _mm._global_forward_pre_hooks or
                _mm._global_backward_hooks or _mm._global_backward_pre_hooks or
                getattr(_mm, "_global_forward_hooks_always_called", None))
