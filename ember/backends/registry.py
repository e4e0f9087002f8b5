"""Backend registry.

A backend follows the protocol Dynamo backends use: `backend(gm: torch.fx.GraphModule,
example_inputs: list[Tensor]) -> callable`. Built-in backends are registered by import path so
`import ember` stays cheap; user backends are registered with `register_backend(name, fn)`.

Every backend handed out is wrapped by `_with_fallback`: if compiling a graph raises (an internal
error or a stage's `Unsupported`), the graph runs as captured (eager) with one warning naming the
backend and reason, unless EMBER_STRICT=1, in which case the error propagates.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import threading
from typing import Any, Callable

from .. import config, counters, debug, progress
from ..fallback import fall_back

_BUILTIN: dict[str, str] = {
    "eager": "ember.backends.eager:eager",
    "aot_eager": "ember.backends.aot_eager:aot_eager",
    "ember": "ember.backends.ember:ember_backend",
}
# the options each built-in backend reads (ember.compile(options=...) is checked against them)
BUILTIN_OPTIONS: dict[str, tuple[str, ...]] = {
    "eager": ("ddp_split",),
    "aot_eager": ("partitioner", "ddp_split"),
    "ember": ("fusion", "cpu_codegen", "mode", "triton.autotune", "triton.welford",
              "triton.max_persistent", "triton.rblock", "ddp_split", "speed_check",
              "freeze", "layout", "prepack", "gemm", "backend_cache", "attention", "profile"),
}
_USER: dict[str, Callable] = {}
_RESOLVED: dict[str, Callable] = {}
_lock = threading.Lock()


def register_backend(name: str, fn: Callable | None = None):
    """Register `fn` under `name`; usable as a decorator `@register_backend("mine")`."""
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("backend name must be a non-empty string")

    def deco(f: Callable) -> Callable:
        if not callable(f):
            raise TypeError(f"backend {name!r} must be callable, got {type(f).__name__}")
        with _lock:
            _USER[name] = f
            _RESOLVED.pop(name, None)
        return f

    return deco(fn) if fn is not None else deco


def builtin_options(fn: Callable) -> tuple[str, ...] | None:
    """The options a built-in backend (as handed out by get_backend) reads; None for others."""
    name = getattr(fn, "ember_backend_name", None)
    if name in BUILTIN_OPTIONS and name not in _USER:
        return BUILTIN_OPTIONS[name]
    return None


def list_backends() -> list[str]:
    return sorted(set(_BUILTIN) | set(_USER))


def _raw_backend(name: str) -> Callable:
    if name in _USER:
        return _USER[name]
    if name in _BUILTIN:
        module, attr = _BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), attr)
    raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(list_backends())}")


def get_backend(name: str) -> Callable:
    """The registered backend `name` as a Dynamo-protocol callable (with the fallback policy).

    `torch.compile(model, backend=ember.get_backend("aot_eager"))` runs Dynamo's capture with ours.
    """
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, one of {', '.join(list_backends())}; "
                        f"got {type(name).__name__}")
    with _lock:
        cached = _RESOLVED.get(name)
    if cached is not None:
        return cached
    wrapped = _with_fallback(name, _raw_backend(name))
    with _lock:
        _RESOLVED[name] = wrapped
    return wrapped


def lookup_backend(backend: str | Callable) -> tuple[str, Callable]:
    """(name, callable) for a backend given by name or as a callable."""
    if isinstance(backend, str):
        return backend, get_backend(backend)
    if callable(backend):
        return getattr(backend, "__name__", type(backend).__name__), backend
    raise TypeError(f"backend must be a name or a callable (gm, example_inputs) -> callable; "
                    f"valid names: {', '.join(list_backends())}; got {type(backend).__name__}")


def accepts_options(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "options" or p.kind is p.VAR_KEYWORD for p in params)


def _with_fallback(name: str, fn: Callable) -> Callable:
    takes_options = accepts_options(fn)

    @functools.wraps(fn)
    def compile_graph(gm, example_inputs, **kwargs: Any):
        if not takes_options:
            kwargs.pop("options", None)  # e.g. mode="max-autotune" means nothing to "eager"
        try:
            with progress.compiling(), counters.timed(f"backend:{name}"), debug.graph_scope():
                debug.dump("capture", gm.print_readable(print_output=False),
                           summary=f"{len(gm.graph.nodes)} nodes, {len(example_inputs)} inputs, "
                                   f"backend {name}")
                return fn(gm, example_inputs, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the fallback policy is exactly this
            if config.strict():
                raise
            fall_back(name, exc)
            return gm.forward

    compile_graph.ember_backend_name = name
    return compile_graph
