"""Public API: ember.compile, explain, reset, stats, disable, allow_in_graph, mark_dynamic,
mark_static, set_stance, error_on_graph_break, nested_compile_region, save/load_cache_artifacts.

`compile` validates its options, resolves the backend, and hands the object to capture. Modules
are compiled in place through `module._compiled_call_impl` (what `nn.Module.compile` uses), so
the object, its class, state_dict keys and hooks are unchanged, and pickled or deep-copied
modules stay compiled (CompiledCall). Every public function refuses bad input with a
TypeError/ValueError that lists what is valid. Design notes: docs/design/010-user-controls.md.
"""
from __future__ import annotations

import collections
import copy
import functools
import pickle
import types
from typing import Any, Callable

import torch

from . import capture
from .backends import get_backend, lookup_backend
from .backends.layout import LAYOUTS
from .backends.registry import accepts_options, builtin_options
from .config import MODES, CompileSettings


class CompiledCall:
    """The callable installed as `module._compiled_call_impl`.

    nn.Module.__getstate__ drops `_compiled_call_impl`, so the CompiledCall also sits in the
    module's `__dict__` as `_ember_compiled`, which pickling keeps. It pickles as
    `(_recompiled, (module, request))`: the compile() arguments, not the compiled code. pickle
    and torch.save/load and copy.deepcopy (whose memo maps the module to its copy) hand the
    copy to `_recompiled`, which installs a fresh CompiledCall bound to the *copy*; it compiles
    on its first call (its own guards, over its own parameters; the disk cache makes it fast).
    A backend or option that cannot be pickled (a lambda) saves the module uncompiled, with one
    warning. state_dict keys are never touched.
    """

    def __init__(self, module: torch.nn.Module, settings: CompileSettings, *, lazy: bool = False):
        self.module, self.settings = module, settings
        self._run = self._first_call if lazy else capture.compile_module(module, settings)
        module.__dict__["_ember_compiled"] = self

    def __call__(self, *args, **kwargs):
        return self._run(*args, **kwargs)

    def _first_call(self, *args, **kwargs):
        self._run = capture.compile_module(self.module, self.settings)
        return self._run(*args, **kwargs)

    def __reduce__(self):
        request = self.settings.request
        try:
            pickle.dumps(request)
        except Exception as e:  # noqa: BLE001 - any pickling error means "cannot ship it"
            from .logging import warn_once
            warn_once(f"pickle-compiled:{id(self)}",
                      f"{type(self.module).__name__} is saved uncompiled: its compile settings "
                      f"cannot be pickled ({type(e).__name__}: {e}); pass the backend by name "
                      f"(ember.register_backend) or as a module-level function to keep it")
            return (_uncompiled, ())
        return (_recompiled, (self.module, request))

    def __deepcopy__(self, memo):
        copy_ = memo.get(id(self.module))
        if copy_ is None:                       # the CompiledCall alone was deep-copied
            return copy.deepcopy(self.module, memo).__dict__.get("_ember_compiled")
        return _install(copy_, self.settings)


def _install(module: torch.nn.Module, settings: CompileSettings) -> CompiledCall:
    # straight into __dict__: while unpickling, the module's own state is not set yet
    call = CompiledCall(module, settings, lazy=True)
    module.__dict__["_compiled_call_impl"] = call
    return call


def _recompiled(module: torch.nn.Module, request: dict):
    """Unpickling a compiled module: compile the copy with the same compile() arguments."""
    try:
        settings = _settings(**request)
    except (TypeError, ValueError) as e:    # e.g. a backend name not registered here
        from .logging import warn_once
        warn_once(f"unpickle-compiled:{request.get('backend')!r}",
                  f"{type(module).__name__} loads uncompiled: {e}")
        return None
    return _install(module, settings)


def _uncompiled():
    return None


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
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if dynamic not in (None, True, False):
        raise ValueError(f"dynamic must be None, True or False, got {dynamic!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"fullgraph must be True or False, got {fullgraph!r}")
    if isinstance(recompile_limit, bool) or not isinstance(recompile_limit, int):
        raise TypeError(f"recompile_limit must be a positive int, got {recompile_limit!r}")
    if recompile_limit < 1:
        raise ValueError(f"recompile_limit must be a positive int, got {recompile_limit!r}")
    request_dynamic = dynamic
    if callable(backend) and isinstance(getattr(backend, "ember_backend_name", None), str) and \
            get_backend(backend.ember_backend_name) is backend:
        backend = backend.ember_backend_name      # ember.backend & co. pickle by name
    name, fn = lookup_backend(backend)
    user_options = dict(options or {})
    valid = builtin_options(fn)
    unknown = sorted(set(user_options) - set(valid)) if valid is not None else []
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for backend {name!r}; valid options: "
                         f"{', '.join(valid)}")
    if user_options.get("layout", "auto") not in (*LAYOUTS, False):
        raise ValueError(f"options layout={user_options['layout']!r}: valid values are "
                         f"{', '.join(LAYOUTS)}")
    if user_options.get("attention", "auto") not in ("auto", "as_written", False):
        raise ValueError(f"options attention={user_options['attention']!r}: valid values are "
                         "auto, as_written")
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
    request = dict(backend=backend, mode=mode, fullgraph=fullgraph, dynamic=request_dynamic,
                   options=user_options or None, recompile_limit=recompile_limit)
    return CompileSettings(backend=fn, backend_name=name, mode=mode, fullgraph=bool(fullgraph),
                           dynamic=dynamic, options=options, recompile_limit=recompile_limit,
                           request=request)


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
    if not callable(fn):
        raise TypeError(f"ember.disable expects a function (or use it as a decorator), got "
                        f"{type(fn).__name__}")

    @functools.wraps(fn)
    def eager_only(*args, **kwargs):
        return fn(*args, **kwargs)

    eager_only._ember_disabled = True
    return eager_only


def allow_in_graph(fn: Callable):
    """Put calls to `fn` into the graph as one opaque node instead of tracing into it."""
    if not callable(fn) or isinstance(fn, (type, torch.nn.Module)):
        raise TypeError(f"ember.allow_in_graph expects a function, got {type(fn).__name__}")
    try:
        fn._ember_allow_in_graph = True
    except (AttributeError, TypeError):
        raise TypeError(f"ember.allow_in_graph expects a Python function; {fn!r} takes no "
                        f"attributes (wrap it in a def)") from None
    return fn


def _dims_of(fname: str, t, dim) -> set:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fname} expects a torch.Tensor, got {type(t).__name__}")
    if dim is None:
        return set(range(t.dim()))
    dims = [dim] if isinstance(dim, int) and not isinstance(dim, bool) else dim
    if not isinstance(dims, (list, tuple, set, range)):
        raise TypeError(f"{fname}: dim must be an int or a list of ints, got {type(dim).__name__}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise ValueError(f"{fname}: dim {d!r} is out of range for a {t.dim()}-d tensor "
                             f"(valid: {-t.dim()} .. {t.dim() - 1})")
    return {d % t.dim() for d in dims}


def mark_dynamic(t, dim) -> None:
    """Trace dim `dim` (an int or a list of ints) of tensor `t` with a symbolic size from the
    first compile on, instead of waiting for a second distinct size (dynamic=None). Sizes 0 and
    1 still specialize; dynamic=False ignores the mark."""
    dims = _dims_of("mark_dynamic", t, dim)
    t._ember_dynamic_dims = set(getattr(t, "_ember_dynamic_dims", ())) | dims
    t._ember_static_dims = set(getattr(t, "_ember_static_dims", ())) - dims


def mark_static(t, dim=None) -> None:
    """Keep dim `dim` (an int, a list of ints, or None: every dim) of tensor `t` static: automatic
    dynamic never makes it symbolic when its size changes (a new size recompiles instead), and
    dynamic=True leaves it static too. Undoes an earlier mark_dynamic of the same dim.

    torch's mark_static also takes an nn.Module (class) and then specializes on its parameters;
    ember's parameters are always graph inputs, so a module is refused with TypeError."""
    if isinstance(t, torch.nn.Module) or isinstance(t, type) and issubclass(t, torch.nn.Module):
        raise TypeError("mark_static expects a torch.Tensor; ember does not specialize modules "
                        "(their parameters and buffers are graph inputs, guarded by shape)")
    dims = _dims_of("mark_static", t, dim)
    t._ember_static_dims = set(getattr(t, "_ember_static_dims", ())) | dims
    t._ember_dynamic_dims = set(getattr(t, "_ember_dynamic_dims", ())) - dims


class _StanceScope:
    """What set_stance returns: the switch is already made; `with` restores the previous stance
    on exit, and as a decorator it undoes the switch and makes it around each call instead."""

    def __init__(self, stance: str, prev: str):
        self.stance, self.prev = stance, prev

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        capture.set_stance(self.prev)
        return False

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError(f"set_stance(...) decorates a function, got {type(fn).__name__}")
        capture.set_stance(self.prev)
        stance = self.stance

        @functools.wraps(fn)
        def with_stance(*args, **kwargs):
            prev = capture.set_stance(stance)
            try:
                return fn(*args, **kwargs)
            finally:
                capture.set_stance(prev)
        return with_stance


class _BreakScope:
    """What error_on_graph_break returns: a context manager (re-entrant) and a decorator."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(capture.ERROR_ON_BREAK.set(self.enabled))
        return self

    def __exit__(self, *exc):
        capture.ERROR_ON_BREAK.reset(self._tokens.pop())
        return False

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError(f"error_on_graph_break(...) decorates a function, got "
                            f"{type(fn).__name__}")

        @functools.wraps(fn)
        def scoped(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return scoped


def set_stance(stance: str = "default") -> _StanceScope:
    """Change how compiled callables behave, without compiling again (like torch.compiler.set_stance):

      "default"             compile on a miss, as usual
      "force_eager"         run every compiled function/module eagerly; nothing is compiled
      "eager_on_recompile"  use existing compiled entries; where one would recompile, run eagerly
      "fail_on_recompile"   use existing entries; where one would recompile, raise
                            ember.RecompileError naming the guard that failed (a frame never
                            compiled still compiles the first time)

    A plain call switches the process-wide stance now; `with ember.set_stance(s):` switches it
    for the block; `@ember.set_stance(s)` for each call of the decorated function."""
    if not isinstance(stance, str):
        raise TypeError(f"stance must be a str, one of {', '.join(capture.STANCES)}; "
                        f"got {type(stance).__name__}")
    prev = capture.set_stance(stance)           # ValueError listing the stances
    return _StanceScope(stance, prev)


def error_on_graph_break(enabled: bool = True) -> _BreakScope:
    """`with ember.error_on_graph_break(True):` a scoped fullgraph=True: a frame compiled inside
    the block raises ember.Unsupported (file:line, reason) where it would graph-break, instead
    of splitting the graph. `error_on_graph_break(False)` inside an outer True allows breaks
    again. It applies where compiling happens (the first call, a recompile): frames compiled
    before the block keep their graphs. Also a decorator."""
    if not isinstance(enabled, bool):
        raise TypeError(f"error_on_graph_break expects True or False, got {enabled!r}")
    return _BreakScope(enabled)


def nested_compile_region(fn_or_module=None):
    """Compile a repeated block once and reuse its compiled code for every call and instance
    (e.g. the 12 identical blocks of a transformer). Takes a function, an nn.Module instance or
    an nn.Module subclass (all its instances); marks it and returns it. Also a decorator (on a
    function or a `forward`), with or without parentheses.

    Called from code that ember compiles, a region is not inlined into the caller's graph: the
    caller's graph is split around the call, and the call goes to the region's own compiled
    unit, cached per (code, compile settings) like every ember frame. Its parameters and buffers
    are inputs of its graph (read per instance), not constants guarded by identity, so the
    first instance's compile serves every instance with the same shapes/dtypes: captured and
    compiled once instead of N times. Values and gradients are eager's (the unit is an ordinary
    compiled frame with its own autograd graph).

    Trade-off (vs torch, whose region is a subgraph inside the caller's graph): no fusion across
    a region's boundary, and the caller's code around it is its own graphs (a loop over the
    blocks runs as Python that calls the compiled region). Under fullgraph=True or
    error_on_graph_break(True), where no split is allowed, the region is inlined instead (one
    graph, compiled per instance). Called outside compiled code, a region runs eagerly."""
    if fn_or_module is None:
        return nested_compile_region
    if isinstance(fn_or_module, torch.nn.Module):
        fn_or_module.__dict__["_ember_region"] = True
    elif isinstance(fn_or_module, type) and issubclass(fn_or_module, torch.nn.Module) or \
            isinstance(fn_or_module, types.FunctionType):
        fn_or_module._ember_region = True
    else:
        raise TypeError(f"nested_compile_region expects a Python function, an nn.Module or an "
                        f"nn.Module subclass, got {type(fn_or_module).__name__}")
    return fn_or_module


def save_cache_artifacts() -> bytes:
    """The disk-cache entries this process built or used since the last reset (compiled
    kernels, whole-graph entries) as one versioned blob, to make another machine's cache warm:
    `ember.load_cache_artifacts(blob)` there (same ember, torch, Python, C++ compiler and CPU
    architecture; checked on load). Format: ember/runtime/artifacts.py."""
    from . import __version__
    from .runtime import artifacts
    return artifacts.save(__version__)


def load_cache_artifacts(data: bytes) -> dict:
    """Unpack a blob from save_cache_artifacts into this process's cache dir (EMBER_CACHE_DIR);
    compiles of the same graphs then hit it. Returns {"kernels": n, "graphs": m} loaded. A
    corrupt, truncated or foreign blob (another ember, torch, Python, compiler or CPU) raises
    ValueError saying which, and nothing is written: every file is checked first, then written
    to a temp file and renamed into place."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"load_cache_artifacts expects bytes (from ember.save_cache_artifacts()), "
                        f"got {type(data).__name__}")
    from . import __version__
    from .runtime import artifacts
    return artifacts.load(bytes(data), __version__)


def reset() -> None:
    """Drop every cache: captured frames, compiled graphs, warn-once memory, counters."""
    from . import counters
    from .logging import reset_warnings
    from .backends.ember import STATS as graph_stats
    from .runtime import cache as disk_cache
    from .backends import speed
    capture.reset()
    disk_cache.USED.clear()
    speed.DECISIONS.clear()
    reset_warnings()
    counters.clear()
    graph_stats.clear()


def stats() -> dict:
    """Counters since the last reset: {"counts": {...}, "compile_seconds": {stage: s}}.

    counts: graphs (captured and compiled), recompiles, breaks, fallbacks (capture and backend),
    frozen_graphs / refolds / channels_last_graphs (backends/freeze.py, layout.py),
    speed_kernels_graphs / speed_eager_graphs / speed_undecided_timings / speed_unsure_graphs
    (the speed check's choices, backends/speed.py), eager_calls, kernel_graphs /
    graph_cache_hits / kernels (the C++/Triton backend).
    compile_seconds: per stage, exclusive (capture, aot, codegen, backend:<name> for the rest)."""
    from . import counters
    from .backends.ember import STATS as graph_stats
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
    if not callable(fn):
        raise TypeError(f"ember.explain expects a function or an nn.Module, got {type(fn).__name__}")
    from .capture import explain as _explain
    return _explain(fn, *args, **kwargs)
