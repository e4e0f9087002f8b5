"""Public API: ember.compile, explain, reset, disable, allow_in_graph.

`compile` validates its options, resolves the backend, and hands the object to capture. Modules
are compiled in place through `module._compiled_call_impl` (what `nn.Module.compile` uses), so
the object, its class, state_dict keys, hooks and pickling are unchanged.
"""
from __future__ import annotations

import collections

import functools
from typing import Any, Callable

import torch

from . import capture
from .backends import lookup_backend
from .backends.registry import accepts_options
from .config import MODES, CompileSettings


class CompiledCall:
    """The callable installed as `module._compiled_call_impl`.

    nn.Module.__getstate__ drops `_compiled_call_impl`, so a pickled, loaded or deep-copied module
    runs eagerly until it is compiled again.
    """

    def __init__(self, module: torch.nn.Module, settings: CompileSettings):
        self.settings = settings
        self._run = capture.compile_module(module, settings)

    def __call__(self, *args, **kwargs):
        return self._run(*args, **kwargs)


def compile(obj: Callable | None = None, *, backend: str | Callable = "ember", mode: str = "default",
            fullgraph: bool = False, dynamic: bool | None = None, options: dict | None = None,
            recompile_limit: int = 8):
    """Compile an nn.Module (in place, returns the same object) or a function (returns a wrapper).

    Usable as `ember.compile(f)`, `@ember.compile` and `@ember.compile(backend=..., ...)`.
    """
    settings = _settings(backend, mode, fullgraph, dynamic, options, recompile_limit)
    if obj is None:
        return functools.partial(_compile_with, settings=settings)
    return _compile_with(obj, settings)


#: backends that compile symbolic graphs (dynamic shapes) correctly
DYNAMIC_BACKENDS = ("eager", "aot_eager", "ember")


def _settings(backend, mode, fullgraph, dynamic, options, recompile_limit) -> CompileSettings:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if dynamic not in (None, True, False):
        raise ValueError(f"dynamic must be None, True or False, got {dynamic!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    if not isinstance(recompile_limit, int) or recompile_limit < 1:
        raise ValueError(f"recompile_limit must be a positive int, got {recompile_limit!r}")
    name, fn = lookup_backend(backend)
    user_options = dict(options or {})
    options = dict(user_options)
    if mode != "default":
        options.setdefault("mode", mode)  # backends see the mode as an option
    if not getattr(fn, "ember_backend_name", None) and not accepts_options(fn):
        if user_options:
            raise ValueError(f"backend {name!r} takes no options (it is called as fn(gm, "
                             f"example_inputs)); got options {sorted(user_options)}")
    elif options:
        fn = _bind_options(fn, options)
    if dynamic is None and (getattr(fn, "ember_backend_name", None) or name) not in DYNAMIC_BACKENDS:
        # automatic dynamic hands symbolic graphs to the backend; one that was not written for
        # them (a user callable, inductor through our capture) would specialize on the example
        # inputs. It gets static graphs unless dynamic=True asks for symbolic ones.
        dynamic = False
    return CompileSettings(backend=fn, backend_name=name, mode=mode, fullgraph=bool(fullgraph),
                           dynamic=dynamic, options=options, recompile_limit=recompile_limit)


def _bind_options(fn: Callable, options: dict) -> Callable:
    @functools.wraps(fn)
    def with_options(gm, example_inputs):
        return fn(gm, example_inputs, options=options)
    return with_options


def _compile_with(obj: Any, settings: CompileSettings):
    if isinstance(obj, torch.jit.ScriptModule) or isinstance(obj, torch.jit.ScriptFunction):
        raise TypeError("ember.compile cannot compile a TorchScript module or function; "
                        "compile the original Python module instead")
    if isinstance(obj, torch.nn.Module):
        from .distributed import compile_distributed  # DDP / FSDP2: see ember/distributed.py
        wrapped = compile_distributed(obj, settings, CompiledCall)
        if wrapped is not None:
            return wrapped
        if isinstance(getattr(obj, "_compiled_call_impl", None), CompiledCall):
            raise ValueError(f"{type(obj).__name__} is already compiled by ember; "
                             "call ember.reset() or compile a fresh module")
        obj._compiled_call_impl = CompiledCall(obj, settings)
        return obj
    if not callable(obj):
        raise TypeError(f"ember.compile expects an nn.Module or a callable, got {type(obj).__name__}")
    if getattr(obj, "_ember_disabled", False):
        return obj
    run = capture.compile_function(obj, settings)

    @functools.wraps(obj)
    def compiled(*args, **kwargs):
        return run(*args, **kwargs)

    compiled._ember_compiled = run
    return compiled


def disable(fn: Callable | None = None):
    """Never compile `fn`; capture calls it eagerly (a graph break around the call)."""
    if fn is None:
        return disable

    @functools.wraps(fn)
    def eager_only(*args, **kwargs):
        return fn(*args, **kwargs)

    eager_only._ember_disabled = True
    return eager_only


def allow_in_graph(fn: Callable):
    """Put calls to `fn` into the graph as one opaque node instead of tracing into it."""
    fn._ember_allow_in_graph = True
    return fn


def mark_dynamic(t, dim) -> None:
    """Trace dim `dim` (an int or a list of ints) of tensor `t` with a symbolic size from the
    first compile on, instead of waiting for a second distinct size (dynamic=None). Sizes 0 and
    1 still specialize; dynamic=False ignores the mark."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_dynamic expects a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise ValueError(f"mark_dynamic: dim {d!r} is out of range for a {t.dim()}-d tensor "
                             f"(valid: {-t.dim()} .. {t.dim() - 1})")
    t._ember_dynamic_dims = set(getattr(t, "_ember_dynamic_dims", ())) | {d % t.dim() for d in dims}


def reset() -> None:
    """Drop every cache: captured frames, compiled graphs, warn-once memory, counters."""
    from . import counters
    from .logging import reset_warnings
    from .lower import STATS as graph_stats
    capture.reset()
    reset_warnings()
    counters.clear()
    graph_stats.clear()


def stats() -> dict:
    """Counters since the last reset: {"counts": {...}, "compile_seconds": {stage: s}}.

    counts: graphs (captured and compiled), recompiles, breaks, fallbacks (capture and backend),
    eager_calls, kernel_graphs / graph_cache_hits / kernels (the C++/Triton backend).
    compile_seconds: per stage, exclusive (capture, aot, codegen, backend:<name> for the rest)."""
    from . import counters
    from .lower import STATS as graph_stats
    snap = counters.snapshot()
    counts = collections.Counter(snap["counts"])
    counts.update({k: v for k, v in capture.stats().items() if isinstance(v, int)})
    for g in list(graph_stats):
        counts["kernel_graphs"] += 1
        counts["graph_cache_hits"] += bool(g.get("cached"))
        counts["kernels"] += g.get("kernels", 0)
    snap["counts"] = {k: v for k, v in sorted(counts.items()) if v}
    return snap


def explain(fn: Callable, /, *args, **kwargs):
    """Run `fn(*args, **kwargs)` under capture and report graphs, breaks, guards, recompiles."""
    from .capture import explain as _explain
    return _explain(fn, *args, **kwargs)
