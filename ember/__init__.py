"""ember: a deep-learning compiler for PyTorch.

    model = ember.compile(model)

Stages (one package each, data flows one way): capture → backends → aot → decomp → lower →
schedule → codegen → runtime. See docs/design/ and the README.
"""
from __future__ import annotations

from .api import (allow_in_graph, compile, disable, error_on_graph_break, explain,
                  load_cache_artifacts, mark_dynamic, mark_static, nested_compile_region, reset,
                  save_cache_artifacts, set_stance, stats)
from .backends import get_backend, list_backends, register_backend
from .errors import EmberError, InternalError, RecompileError, Unsupported

__version__ = "0.1.0"

__all__ = [
    "compile", "explain", "reset", "stats", "disable", "allow_in_graph", "mark_dynamic",
    "mark_static", "set_stance", "error_on_graph_break", "nested_compile_region",
    "save_cache_artifacts", "load_cache_artifacts",
    "get_backend", "list_backends", "register_backend",
    "Unsupported", "EmberError", "InternalError", "RecompileError", "backend", "__version__",
]


def __getattr__(name: str):
    # `ember.backend` is the default backend as a torch.compile-protocol callable, resolved lazily
    # so `import ember` does not import the whole pipeline.
    if name == "backend":
        return get_backend("ember")
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
