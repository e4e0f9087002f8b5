"""Capture entry points: the function wrapper and the module's `_compiled_call_impl`.

Consumes a function or nn.Module + CompileSettings; produces a callable that binds the call's
arguments to the frame's locals, tries the cache entries of the code object (MRU first; each a
generated guard+run function), and on a miss traces the frame (interpreter.py), hands the graph
to `settings.backend(gm, example_inputs)` and adds an entry. After `recompile_limit` entries the
frame runs eagerly with one warning naming the guard that failed. An Unsupported construct
raises under fullgraph=True, else the frame runs eagerly with one warning (file:line, reason).
"""
from __future__ import annotations

import collections
import functools
import threading
import types
import weakref

import torch

from .. import config, debug
from ..config import CompileSettings
from ..errors import InternalError, RecompileError, Unsupported
from ..logging import enabled, get_logger, warn_once
from ..runtime.pycode import compile_cached
from ..shapes import LOWER_BOUND
from .breaks import GENERATOR_FLAGS, compile_break, runs_eagerly
from .calls import compiled_by_torch
from .functorch import is_functorch
from .controls import fullgraph, global_hooks_present
from .effects import finalize
from .guards import RANKS, global_state
from .hooks import has_backward_hooks, root_call_for, root_eager_call, untraceable_hooks
from .interpreter import CO_VARARGS, CO_VARKEYWORDS, Frame, Retrace, Tracer
from . import statecheck
from .sources import AttrSource, ClosureSource, ConstSource, DictEntrySource, LocalSource
from .values import ObjV

MISS = object()
EAGER = object()
_RAISES = "raises: "        # reason prefix of an eager entry whose trace raised
STATS: collections.Counter = collections.Counter()
CACHES: dict = {}


# ---- user controls (ember.set_stance, ember.error_on_graph_break) ------------------------------
STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile")
STANCE = "default"          # read on the miss path only
FORCE_EAGER = False         # the fast path's one extra check: a global load


def set_stance(stance: str) -> str:
    """Switch the process-wide stance; returns the previous one."""
    global STANCE, FORCE_EAGER
    if stance not in STANCES:
        raise ValueError(f"unknown stance {stance!r}; valid stances: {', '.join(STANCES)}")
    prev, STANCE, FORCE_EAGER = STANCE, stance, stance == "force_eager"
    return prev


def stats() -> dict:
    """Counters: graphs (compiled), recompiles, fallbacks, unsupported, calls_compiled, refreshes
    (structural guards re-checked because a module-state snapshot changed)."""
    return dict(STATS)


def reset() -> None:
    """Drop every capture cache and counter (runners keep their FrameCache object)."""
    for c in CACHES.values():
        c.entries.clear()
        c.n_compiled = 0
        c.dynamic_dims.clear()
    STATS.clear()


class Entry:
    __slots__ = ("run", "guards", "gm", "source", "n_ops", "eager", "reason", "breaks", "modules")

    def __init__(self, run, guards, gm, source, n_ops, eager=False, reason=None, modules=None):
        self.run, self.guards, self.gm, self.source = run, guards, gm, source
        self.n_ops, self.eager, self.reason = n_ops, eager, reason
        self.breaks: list = []
        # local index -> weak ref of the module the trace saw there (automatic dynamic asks
        # whether a changed module int belongs to that same module)
        self.modules: dict = modules or {}


class FrameCache:
    def __init__(self, code):
        self.code = code
        self.entries: list[Entry] = []
        self.n_compiled = 0
        self.limit_hit = False
        self.dynamic_dims: dict[str, set] = {}     # automatic dynamic: source expr → dims
        # Held while a miss compiles, so threads racing on a cold frame compile it once.
        # Re-entrant: compiling may call back into the same frame (recursion, nested compile).
        self.lock = threading.RLock()


def _cache_for(code, settings: CompileSettings) -> FrameCache:
    # One cache per (code object, compile settings): two instances of a class share compiled
    # code, but a frame compiled for backend "eager" must never serve a call made for "ember".
    key = (code, settings.backend, settings.mode, settings.fullgraph, settings.dynamic)
    c = CACHES.get(key)
    if c is None:
        c = CACHES[key] = FrameCache(code)
    return c


class Runner:
    """Calls one Python function through the capture cache."""

    def __init__(self, fn: types.FunctionType, settings: CompileSettings, bound_self=None,
                 eager=None):
        self.fn, self.settings, self.code = fn, settings, fn.__code__
        self.bound_self = bound_self
        self.eager = eager
        co = self.code
        self.nargs = co.co_argcount + co.co_kwonlyargcount + bool(co.co_flags & CO_VARARGS) + \
            bool(co.co_flags & CO_VARKEYWORDS)
        self.argnames = co.co_varnames[:self.nargs]
        self.fresh_names = set(self.argnames[co.co_argcount + co.co_kwonlyargcount:])
        self.simple = not (co.co_flags & (CO_VARARGS | CO_VARKEYWORDS)) and not co.co_kwonlyargcount
        self.cache = _cache_for(co, settings)
        self.fast_n = co.co_argcount - (bound_self is not None) if self.simple else -1

    # ---- argument binding -----------------------------------------------------------------
    def bind(self, args, kwargs) -> tuple:
        if self.bound_self is not None:
            args = (self.bound_self,) + args
        if not kwargs and self.simple and len(args) == self.code.co_argcount:
            return args
        co, fn = self.code, self.fn
        n = co.co_argcount
        out = list(args[:n])
        extra = args[n:]
        if extra and not co.co_flags & CO_VARARGS:
            raise TypeError(f"{fn.__qualname__}() takes {n} positional arguments but "
                            f"{len(args)} were given")
        kwargs = dict(kwargs)
        defaults = fn.__defaults__ or ()
        for i in range(len(out), n):
            name = co.co_varnames[i]
            if name in kwargs:
                out.append(kwargs.pop(name))
            elif i >= n - len(defaults):
                out.append(defaults[i - (n - len(defaults))])
            else:
                raise TypeError(f"{fn.__qualname__}() missing required argument: {name!r}")
        kwd = fn.__kwdefaults__ or {}
        for i in range(n, n + co.co_kwonlyargcount):
            name = co.co_varnames[i]
            if name in kwargs:
                out.append(kwargs.pop(name))
            elif name in kwd:
                out.append(kwd[name])
            else:
                raise TypeError(f"{fn.__qualname__}() missing keyword argument: {name!r}")
        if co.co_flags & CO_VARARGS:
            out.append(tuple(extra))
        if co.co_flags & CO_VARKEYWORDS:
            out.append(kwargs)
        elif kwargs:
            raise TypeError(f"{fn.__qualname__}() got unexpected keyword arguments {sorted(kwargs)}")
        return tuple(out)

    def __call__(self, /, *args, **kwargs):      # a keyword argument may be named `self`
        if FORCE_EAGER:                 # ember.set_stance("force_eager"): no guard, no compile
            return self.run_eager(self.bind(args, kwargs))
        # fast path: positional call, MRU entry hits
        if kwargs or len(args) != self.fast_n:
            locals_ = self.bind(args, kwargs)
        elif self.bound_self is not None:
            locals_ = (self.bound_self,) + args
        else:
            locals_ = args
        entries = self.cache.entries
        if entries:
            r = entries[0].run(self.fn, *locals_)
            if r is not MISS and r is not EAGER:
                return r
        return self._slow(locals_)

    def _slow(self, locals_):
        r = self._lookup(locals_)
        if r is not MISS:
            return r
        with self.cache.lock:
            r = self._lookup(locals_)  # another thread may have compiled it meanwhile
            return self.miss(locals_) if r is MISS else r

    def _lookup(self, locals_):
        entries = self.cache.entries
        fn = self.fn
        for i, e in enumerate(entries):
            r = e.run(fn, *locals_)
            if r is not MISS:
                if i:
                    entries.insert(0, entries.pop(i))
                if r is EAGER:
                    return self.run_eager(locals_)
                return r
        return MISS

    def run_eager(self, locals_):
        STATS["eager_calls"] += 1
        return _call_with_locals(self.fn, self.code, locals_)

    # ---- miss: compile or fall back ---------------------------------------------------------
    def miss(self, locals_):
        cache, settings = self.cache, self.settings
        if global_state()[5]:
            # called under torch.func.vmap/grad/...: the arguments are functorch-wrapped tensors
            # (BatchedTensor has no storage for a kernel) and the graph's autograd.Function has
            # no functorch rule; Dynamo skips such frames too
            warn_once(f"functorch:{id(cache.code)}", f"{_where(cache.code)} is called under a "
                      "torch.func transform (vmap/grad/...); it runs eagerly there")
            return self.run_eager(locals_)
        if torch._C._len_torch_dispatch_stack():
            # a user TorchDispatchMode is active: it must see each op as it runs (and would see
            # capture's meta tensors), so nothing is compiled under it, as with torch.compile
            warn_once(f"dispatch-mode:{id(cache.code)}", f"{_where(cache.code)} runs eagerly "
                      f"while a TorchDispatchMode is active")
            return self.run_eager(locals_)
        failed = _first_failed_guard(cache.entries, self.fn, locals_)
        if cache.n_compiled >= settings.recompile_limit:
            STATS["fallbacks"] += 1
            warn_once(f"recompile-limit:{id(cache.code)}",
                      f"{_where(cache.code)}: hit the recompile limit "
                      f"({settings.recompile_limit}); running eagerly from now on. "
                      f"Last failed guard: {failed}")
            return self.run_eager(locals_)
        if cache.entries and STANCE != "default":
            if STANCE == "eager_on_recompile":
                return self.run_eager(locals_)
            if STANCE == "fail_on_recompile":
                raise RecompileError(f"{_where(cache.code)} would recompile under stance "
                                     f"'fail_on_recompile'; failed guard: {failed}")
        if cache.entries:
            STATS["recompiles"] += 1
            changed = _mark_dynamic_dims(cache, self.fn, locals_, settings)
            if enabled("recompiles"):
                get_logger("recompiles").info("recompiling %s: guard failed: %s%s",
                                              _where(cache.code), failed, changed)
        entry = self.compile(locals_)
        cache.entries.insert(0, entry)
        cache.n_compiled += 1
        r = entry.run(self.fn, *locals_)
        if r is MISS:
            # compiling changed state the trace had read (torch's first meta op imports
            # torch._dynamo, which writes os.environ): trace once more from the state as it is
            cache.entries[0] = entry = self.compile(locals_)
            r = entry.run(self.fn, *locals_)
        if r is MISS:
            raise InternalError(f"guards of a fresh entry for {_where(cache.code)} fail on the "
                                f"inputs they were built from: {_first_failed_guard([entry], self.fn, locals_)}")
        if r is EAGER:
            if entry.reason is not None and entry.reason.startswith(_RAISES):
                return self._eager_expecting_raise(locals_, entry)
            return self.run_eager(locals_)
        return r

    def _eager_expecting_raise(self, locals_, entry):
        """The trace raised, so eager should too. When it does not, the trace was wrong (a
        capture bug): the frame keeps running eagerly for these guards, loudly."""
        r = self.run_eager(locals_)
        reason = f"the trace raised where the eager call did not ({entry.reason[len(_RAISES):]})"
        if config.strict():
            raise InternalError(f"{_where(self.code)}: {reason}")
        STATS["fallbacks"] += 1
        runs_eagerly(f"raises:{id(self.code)}", self.code, self.code.co_firstlineno, reason)
        entry.reason = reason
        return r

    def compile(self, locals_) -> Entry:
        with debug.graph_scope():       # EMBER_DEBUG_DIR: one folder for the frame's stages
            while True:       # each retrace follows one more lazy module's materialization
                try:
                    return self._compile(locals_)
                except Retrace:
                    continue

    def _compile(self, locals_) -> Entry:
        tr = Tracer(self.settings)
        try:
            try:
                ret = self.trace(tr, locals_)
                plan = finalize(tr, ret)
            finally:
                torch._C._set_grad_enabled(tr.state0[0])
                for c in reversed(tr.real_contexts):
                    c.__exit__(None, None, None)
        except Unsupported as e:
            STATS["unsupported"] += 1
            if fullgraph(self.settings):
                raise
            entry = compile_break(self, locals_, e)
            if entry is not None:
                STATS["graph_breaks"] += 1
                return entry
            if getattr(e, "raises", False):
                # the frame raises on these inputs: eager raises the same exception from the
                # user's own frames, and a function that raises has no speed to lose (no
                # warning, unless the eager call then does not raise: see miss)
                return build_entry(tr, None, self.argnames, eager=True, reason=_RAISES + str(e))
            STATS["fallbacks"] += 1
            why = f"\n(no graph break here: {e.no_break})" if getattr(e, "no_break", None) else ""
            runs_eagerly(f"unsupported:{id(self.code)}:{e.reason}", self.code,
                         self.code.co_firstlineno, f"{e}{why}")
            return build_entry(tr, None, self.argnames, eager=True, reason=str(e))
        except Retrace:
            raise
        except Exception as e:  # noqa: BLE001 - internal errors fall back unless strict
            if config.strict():
                raise
            STATS["fallbacks"] += 1
            runs_eagerly(f"internal:{id(self.code)}", self.code, self.code.co_firstlineno,
                         f"internal error while capturing: {type(e).__name__}: {e}")
            return build_entry(tr, None, self.argnames, eager=True, reason=repr(e))
        return build_entry(tr, plan, self.argnames, settings=self.settings)

    # ---- what breaks.compile_break uses of this layer ---------------------------------------
    @property
    def route(self):
        """The dispatcher residual code sends its calls through (compiled as their own roots)."""
        return functools.partial(dispatch, self.settings)

    def make_entry(self, tr: Tracer, plan) -> Entry:
        return build_entry(tr, plan, self.argnames, settings=self.settings)

    def trace(self, tr: Tracer, locals_):
        tr.dynamic_dims = self.cache.dynamic_dims      # automatic dynamic: dims seen changing
        tr.guard("GLOBAL_STATE", None, tr.state0)
        co, fn = self.code, self.fn
        frame_locals = {}
        for i, name in enumerate(self.argnames):
            v = tr.wrap(locals_[i], LocalSource(name, i))
            frame_locals[name] = v
            if name in self.fresh_names:
                tr.fresh.add(id(v))      # *args / **kwargs are new objects: no caller effects
            if isinstance(locals_[i], torch.nn.Module):
                tr.roots.append(v.source)
                tr.root_refs[i] = weakref.ref(locals_[i])
        cells = {}
        if fn.__closure__:
            for i, name in enumerate(co.co_freevars):
                cells[name] = tr.real_cell(fn.__closure__[i], ClosureSource(ConstSource("__fn"), i))
        frame = Frame(co, frame_locals, cells, fn.__globals__, tr.gid_for(fn.__globals__),
                      ObjV(fn, ConstSource("__fn")))
        if co.co_flags & 0x20:
            raise tr.unsupported("compiling a generator function")
        from .interpreter import TracedRaise
        try:
            return tr.run_frame(frame)
        except TracedRaise as e:
            tr.frames.append(frame)
            err = tr.unsupported(f"the traced code raises {type(e.exc).__name__}: {e.exc}",
                                 hint="it raises eagerly too")
            err.raises = True
            raise err from None


def _call_with_locals(fn, code, locals_):
    n = code.co_argcount
    args = list(locals_[:n])
    kwargs = {}
    idx = n
    for i in range(code.co_kwonlyargcount):
        kwargs[code.co_varnames[n + i]] = locals_[idx]
        idx += 1
    if code.co_flags & CO_VARARGS:
        args.extend(locals_[idx])
        idx += 1
    if code.co_flags & CO_VARKEYWORDS:
        kwargs.update(locals_[idx])
    return fn(*args, **kwargs)


def _mark_dynamic_dims(cache: FrameCache, fn, locals_, settings) -> str:
    """Automatic dynamic (dynamic=None): an input tensor whose only change against an entry's
    guard is the size of some dims gets those dims symbolic in the next compile (an int argument
    or module attribute that changed: the value itself). Returns the recompile reason's tail
    ('; L['x'] dim 1: 7 → 16, now dynamic')."""
    if settings.dynamic is not None:
        return ""
    ns = _guard_namespace(cache.entries[0], fn, locals_)
    notes = []
    for e in cache.entries:
        for g in e.guards:
            # module state: ints (a step counter) may become dynamic, tensors keep their shapes
            if g.kind not in ("EQ", "TENSOR") or g.structural and g.kind != "EQ":
                continue
            try:
                v = eval(g.source.expr(), ns)
            except Exception:  # noqa: BLE001 - the value is gone: nothing to compare
                continue
            marks = cache.dynamic_dims.setdefault(g.source.expr(), set())
            if g.kind == "EQ":
                if type(g.expected) is int and type(v) is int and v != g.expected and \
                        v >= LOWER_BOUND and "value" not in marks and \
                        _same_module(e, g.source, locals_):
                    marks.add("value")
                    notes.append(f"{g.source.name()}: {g.expected} → {v}, now dynamic")
                continue
            _, dtype, _, shape = g.expected[:4]
            if not isinstance(v, torch.Tensor) or v.dtype != dtype or v.dim() != len(shape):
                continue
            static = getattr(v, "_ember_static_dims", ())      # ember.mark_static
            for d, n in enumerate(shape):
                if n is not None and n != v.shape[d] and v.shape[d] >= LOWER_BOUND and \
                        d not in marks and d not in static:
                    marks.add(d)
                    notes.append(f"{g.source.name()} dim {d}: {n} → {v.shape[d]}, now dynamic")
    return "".join(f"; {n}" for n in dict.fromkeys(notes))


def _same_module(entry: Entry, source, locals_) -> bool:
    """Whether an int read through a module-valued local belongs to the module the entry was
    traced with. Only then is a change a counter (made dynamic); another instance of the class
    (a second model's block, the next layer called after a graph break) has its own
    configuration (window sizes, strides) and gets its own specialized entry."""
    while getattr(source, "base", None) is not None:
        source = source.base
    ref = entry.modules.get(getattr(source, "index", None)) if isinstance(source, LocalSource) \
        else None
    return ref is None or ref() is locals_[source.index]


def _guard_namespace(entry: Entry, fn, locals_) -> dict:
    """The names an entry's guard expressions read: its generated globals, `__fn`, `L<i>`."""
    ns = dict(entry.run.__globals__)
    ns["__fn"] = fn
    for i, v in enumerate(locals_):
        ns[f"L{i}"] = v
    return ns


def _where(code) -> str:
    return f"{code.co_filename}:{code.co_firstlineno} ({code.co_qualname})"


def _first_failed_guard(entries, fn, locals_) -> str | None:
    if not entries:
        return None
    e = entries[0]
    ns = _guard_namespace(e, fn, locals_)
    for g in e.guards:
        try:
            ok = eval(g.expr(_Binder(ns)), ns)
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            return g.describe()
    return None


class _Binder:
    def __init__(self, ns):
        self.ns = ns
        self.names: dict = {}

    def __call__(self, obj):
        name = self.names.get(id(obj))
        if name is not None:
            return name
        name = f"__g{len(self.ns)}"
        self.ns[name] = obj
        self.names[id(obj)] = (name)
        return name


def build_entry(tr: Tracer, plan, argnames, eager=False, reason=None, settings=None) -> Entry:
    """Generate the guard+run function of one cache entry."""
    ns = tr.ns
    from .sources import instance_dict
    ns.update({"__MISS": MISS, "__EAGER": EAGER, "__odict": instance_dict,
               "__snapshot": statecheck.snapshot})
    binder = _Binder(ns)
    if not eager and plan.gm is not None and plan.n_ops:
        # the backend first: its tracing adds the shape guards it assumed (dynamic shapes)
        ns["__compiled"] = settings.backend(plan.gm, plan.example_inputs)
        STATS["graphs"] += 1
    guards = sorted(tr.guards + tr.shape_guards(), key=lambda g: RANKS[g.kind])
    if tr.shape_env is not None:
        tr.shape_env.frozen = True
    fast = [g for g in guards if not g.structural]
    struct = [g for g in guards if g.structural]
    args = ", ".join(f"L{i}" for i in range(len(argnames)))
    sig = f"__fn{', ' if args else ''}{args}"
    lines = [f"def __entry({sig}):", "    try:"]
    if fast:
        lines.append("        if not (" + "\n                and ".join(
            g.expr(binder) for g in fast) + "):")
        lines.append("            return __MISS")
    structural_inputs = plan.structural_inputs if plan is not None else []
    roots = [r for r in tr.roots]
    if struct or structural_inputs:
        # one state per root module (a class's forward serves every instance): its snapshot,
        # its structural inputs, weak refs to the roots (a state never keeps a model alive)
        key = _state_key(roots)
        lines.append(f"        __s = __states.get({key})")
        lines.append("        if __s is None or not __s[0]()" + "".join(
            f" or __s[{i + 2}]() is not {r.expr()}" for i, r in enumerate(roots)) + ":")
        lines.append(f"            __s = __refresh({sig})")
        lines.append("            if __s is None:")
        lines.append("                return __MISS")
    lines.append("    except Exception:")
    lines.append("        return __MISS")
    if eager:
        lines.append("    return __EAGER")
    else:
        call_args = (["*__s[1]"] if structural_inputs else []) + \
            [s.expr() for s in plan.dynamic_inputs]
        if plan.gm is not None and plan.n_ops:
            lines.append(f"    __o = __compiled({', '.join(call_args)})")
        else:
            lines.append("    __o = ()")
        lines.extend("    " + s for s in plan.body)
    if struct or structural_inputs:
        ns.update({"__states": {}, "__STATS": STATS, "__keep": _keep_state})
        lines.append(f"def __refresh({sig}):")
        lines.append("    __STATS['refreshes'] += 1")
        lines.append("    if not (" + "\n            and ".join(
            [g.expr(binder) for g in struct] or ["True"]) + "):")
        lines.append("        return None")
        mods = _module_exprs(struct, structural_inputs, roots)
        tensors = dict.fromkeys([s.expr() for s in structural_inputs] +
                                [g.source.expr() for g in struct if g.kind == "TENSOR"])
        lines.append(f"    return __keep(__states, {key}, (__snapshot(({''.join(m + ', ' for m in mods)}), "
                     f"({''.join(t + ', ' for t in tensors)})), "
                     f"[{', '.join(s.expr() for s in structural_inputs)}]), "
                     f"({''.join(r.expr() + ', ' for r in roots)}))")
    source = "\n".join(lines) + "\n"
    if enabled("guards"):
        get_logger("guards").info("guards for %s:\n%s", tr.frames and "" or "",
                                  "\n".join("  " + g.describe() for g in guards))
    if enabled("graph") and plan is not None and plan.gm is not None:
        get_logger("graph").info("%s", plan.gm.print_readable(print_output=False))
    if debug.active():
        debug.dump("guards", "".join(f"# {g.describe()}\n" for g in guards) + source,
                   summary=f"the cache entry's {len(guards)} guards and its run function"
                           + (" (the frame runs eagerly)" if eager else ""))
    code = compile_cached(source, "<ember-guards>")      # ~0.2 s for a ResNet-50
    exec(code, ns)
    run = ns["__entry"]
    return Entry(run, guards, plan.gm if plan is not None else None, source,
                 plan.n_ops if plan is not None else 0, eager=eager, reason=reason,
                 modules=tr.root_refs)


def _state_key(roots) -> str:
    """The expression keying an entry's per-root states: the roots' ids (None without roots)."""
    if not roots:
        return "None"
    if len(roots) == 1:
        return f"id({roots[0].expr()})"
    return "(" + "".join(f"id({r.expr()}), " for r in roots) + ")"


def _keep_state(states: dict, key, state: tuple, roots: tuple) -> tuple:
    """Store (snapshot, inputs) for `roots` as (snapshot, inputs, *weakrefs); the state goes
    when a root is collected (its id may then be reused by another object)."""
    def drop(_ref, states=states, key=key):
        states.pop(key, None)
    refs = tuple(weakref.ref(r, drop) for r in roots)
    state = state + refs
    states[key] = state
    return state


def _module_exprs(struct, structural_inputs, roots) -> list[str]:
    """Expressions of the modules that structural sources read attributes of (the modules whose
    state a snapshot records): each structural attribute/table read's base, and the roots."""
    out = {r.expr(): None for r in roots}
    for s in [g.source for g in struct] + list(structural_inputs):
        while s is not None:
            base = getattr(s, "base", None)
            if base is not None and s.structural and isinstance(s, (AttrSource, DictEntrySource)):
                out[base.expr()] = None
            s = base
    return list(out)


# ---- residual calls ------------------------------------------------------------------------
_DISPATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# modules whose functions a residual call runs as they are (torch, ember, the standard library)
_EAGER_MODULES = frozenset(("torch", "ember", "builtins", "logging", "warnings", "numpy", "typing",
                            "collections", "functools", "itertools", "inspect", "contextlib",
                            "copy", "re", "importlib", "abc", "enum", "dataclasses", "operator",
                            "math", "types", "os", "sys", "traceback", "threading", "tqdm"))


def _runs_as_is(module_name) -> bool:
    return not module_name or module_name.split(".")[0] in _EAGER_MODULES


def dispatch(settings, fn):
    """What a residual call should call: Python functions and modules of user code and model
    libraries (transformers, torchvision, ...) compiled as their own roots (cached per object);
    torch, the standard library, builtins, generator functions and torch.compile'd callables
    as they are."""
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(func, types.FunctionType) and func.__code__.co_flags & GENERATOR_FLAGS or \
            compiled_by_torch(fn) or is_functorch(func):
        return fn
    region = getattr(fn, "_ember_region", False) is True   # nested_compile_region: compiled
    if isinstance(fn, types.MethodType) and isinstance(func, types.FunctionType):
        if _runs_as_is(func.__module__) and not region:
            return fn
        return compile_function(fn, settings)      # a Runner over the code's shared cache
    if isinstance(fn, (types.FunctionType, torch.nn.Module)):
        if not region and _runs_as_is(getattr(type(fn) if isinstance(fn, torch.nn.Module)
                                              else fn, "__module__", None)):
            return fn
        per = _DISPATCH.setdefault(fn, {})
        key = (settings.backend, settings.mode, settings.dynamic)
        hit = per.get(key)
        if hit is None:
            hit = per[key] = (compile_module if isinstance(fn, torch.nn.Module)
                              else compile_function)(fn, settings)
        return hit
    return fn



# ---- public entry points --------------------------------------------------------------------
def compile_function(fn, settings: CompileSettings):
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return Runner(fn.__func__, settings, bound_self=fn.__self__)
    if isinstance(fn, types.FunctionType):
        return Runner(fn, settings)
    if isinstance(fn, (types.BuiltinFunctionType, torch._ops.OpOverload,
                       torch._ops.OpOverloadPacket)):
        return Runner(_caller_of(fn), settings)     # torch.add, torch.ops.aten.add.Tensor
    call = getattr(type(fn), "__call__", None)
    if isinstance(call, types.FunctionType):
        return Runner(call, settings, bound_self=fn)
    name = getattr(fn, "__qualname__", repr(fn))

    def eager(*args, **kwargs):
        warn_once(f"not-python:{name}", f"{name} is not a Python function; it runs eagerly")
        return fn(*args, **kwargs)
    return eager


def _caller_of(fn):
    """A Python function that calls `fn`, with a code object of its own (capture caches per
    code object): compiling a builtin or an op compiles the call of it, one graph node."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    name = getattr(fn, "__name__", type(fn).__name__)
    call.__code__ = call.__code__.replace(co_name=f"call_{name}_{id(fn):x}",
                                          co_qualname=f"<call of {name}>")
    return call


class ModuleRunner:
    """`module._compiled_call_impl`: with forward hooks (its own or global ones), the hooks and
    forward are one compiled frame (hooks.root_call); with backward hooks or torch's own hooks,
    the hooks run eagerly around the compiled forward; legacy backward hooks → eager
    `_call_impl` (one warning)."""

    def __init__(self, module: torch.nn.Module, settings: CompileSettings):
        self.module = module
        self.settings = settings
        self.hooked = None
        fwd = module.__dict__.get("forward")
        if fwd is not None:
            self.runner = compile_function(fwd, settings)
        else:
            self.runner = Runner(type(module).forward, settings, bound_self=module)
            if not isinstance(type(module).forward, types.FunctionType):
                self.runner = compile_function(module.forward, settings)

    def __call__(self, *args, **kwargs):
        m = self.module
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or \
                m._backward_pre_hooks or global_hooks_present():
            why = untraceable_hooks(m)
            if why or has_backward_hooks(m):
                run = root_eager_call(m, self.runner, args, kwargs)
                if run is not None:     # backward hooks: the forward alone is compiled
                    return run()
                warn_once(f"hooks:{id(m)}", f"{type(m).__name__}: {why}; it runs eagerly")
                STATS["fallbacks"] += 1
                return m._call_impl(*args, **kwargs)
            if self.hooked is None:
                self.hooked = Runner(root_call_for(type(m)), self.settings, bound_self=m)
            return self.hooked(*args, **kwargs)
        return self.runner(*args, **kwargs)


def compile_module(module, settings: CompileSettings):
    return ModuleRunner(module, settings)


def global_state_now():
    return global_state()
