"""Capture, interpreter: symbolic execution of one frame (and everything it inlines).

Consumes a code object + the caller's real arguments; produces a torch.fx.Graph of torch-level
calls, the guard list, the side effects and the return value as values (values.py). Opcode
behaviour lives in handlers/ (one function per opcode in `HANDLERS`); calls in calls.py,
attribute loads in attrs.py; reading the caller's objects (wrap, guards, dynamic dims) in
inputs.py. Tensors run on the meta device (for shapes/dtypes); anything that
needs a tensor's data raises `Unsupported`.
"""
from __future__ import annotations

import builtins
import inspect
import operator
import sys
import types
from types import CodeType

import torch
import torch.fx as fx

from ..errors import Unsupported
from . import numbers
from .bytecode import decode
from .effects import op_writes
from .guards import Guard, global_state
from .inputs import Inputs
from .sources import AttrSource, ClosureSource, ConstSource, GlobalSource, ItemSource, Source
from .subclasses import is_traceable_subclass
from .values import NULL, SYM_TYPES, CellV, DictV, ListV, ObjV, TensorV, TupleV, V, is_literal

MAX_INLINE_DEPTH = 64
CO_VARARGS, CO_VARKEYWORDS, CO_GENERATOR = 0x04, 0x08, 0x20

# Packages whose module-level globals are treated as stable (no guard per global read).
LIBRARY_PREFIXES = ("torch", "torchvision", "transformers", "timm", "typing", "collections",
                    "dataclasses", "functools", "itertools", "math", "enum", "abc", "builtins",
                    "warnings", "logging", "inspect", "contextlib", "operator", "copy", "re",
                    "numbers", "types", "ember", "importlib", "packaging", "einops")


class TracedRaise(Exception):
    """An exception raised by the traced program (not by ember); handled by its try blocks."""

    def __init__(self, exc: BaseException):
        super().__init__(exc)
        self.exc = exc


class StopTrace(Exception):
    """The root frame reached `Tracer.stop_at`: the prefix of a graph break is traced."""

    def __init__(self, frame):
        super().__init__("stop")
        self.frame = frame


class Retrace(Exception):
    """The trace changed the state its guards describe (a lazy module made its parameters and
    became another class): the frame is traced again from the start, once."""


class Return:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Yield(Return):
    """A generator frame paused at `yield value` (resumed by Tracer.resume_generator)."""
    __slots__ = ()


class Frame:
    __slots__ = ("code", "instrs", "pc", "stack", "locals", "cells", "globals", "gid", "fn_v",
                 "generator", "lineno", "self_v")

    def __init__(self, code, locals_, cells, globals_, gid, fn_v=None):
        self.code, self.instrs = code, decode(code)[0]
        self.pc, self.stack, self.locals, self.cells = 0, [], locals_, cells
        self.globals, self.gid, self.fn_v, self.generator = globals_, gid, fn_v, False
        self.lineno = code.co_firstlineno

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out


def _is_library(module_name: str | None) -> bool:
    return bool(module_name) and module_name.split(".")[0] in LIBRARY_PREFIXES


class Tracer(Inputs):
    """One symbolic execution. State: graph, inputs, guards, effects, frames."""

    def __init__(self, settings=None):
        self.settings = settings
        self.graph = fx.Graph()
        self.guards: list[Guard] = []
        self._guard_keys: set = set()
        self.inputs: list[tuple[Source, TensorV, torch.Tensor]] = []
        self.by_real_id: dict[int, TensorV] = {}
        self.keepalive: list = []
        self.real_cells: dict[int, CellV] = {}   # one value per real cell: writes are seen by all
        self.by_source: dict[str, V] = {}
        self.overlay: dict[tuple[int, str], V] = {}     # attribute writes seen during the trace
        self.effects: list[tuple] = []                   # ('setattr', obj_v, name, v), ...
        self.mutated: list[V] = []                       # caller containers mutated in place
        self.global_ids: dict[int, str] = {}
        self.ns: dict = {}                               # names used by generated code
        self.frames: list[Frame] = []
        self.roots: list[Source] = []                    # module-valued locals of the entry frame
        self.root_refs: dict = {}                          # their locals index -> weak ref
        self.state0 = global_state()
        self._n_const = 0
        self._const_names: dict = {}
        self.real_contexts: list = []
        self.fresh: set[int] = set()
        # writes to values (containers, attributes, cells, globals) made so far: a graph break
        # may finish a suspended generator early only if that writes nothing (breaks.py)
        self.writes = 0
        self.generators: list = []                      # GenV of every generator made
        self.owned_in_generator: set[int] = set()
        # a set the trace made, holding values without a constant (tensors: by identity)
        self.set_members: dict[int, list] = {}
        self.tensor_keys: dict = {}                     # id(TensorV) -> its dict key
        self.owned: set[int] = set()                    # ids of real objects the trace created
        self.autocast: dict = {d: dt for d, on, dt in (self.state0[3] or ()) if on}
        self.stop_at: tuple | None = None                # (instruction index, visit) in the root
        self.visits: dict[int, int] = {}
        # dynamic shapes: source expr → dims to make symbolic ("all" under dynamic=True)
        self.dynamic_dims: dict = {}
        self.shape_env = None
        self._symbol_nodes: dict = {}
        self._size_nodes: dict = {}
        self.known: dict = {}          # node -> real value of a tensor made from numbers (numbers.py)
        self.known_sizes: dict = {}    # node -> SymInt value of a tensor made from sizes
        self.new_leaves: dict = {}     # node -> site(): `requires_grad_()` leaves (attrs.py)

    # ---- dispatch helpers (implemented in calls/builtins/handlers) --------------------
    def call(self, fn, args, kwargs):
        from .calls import call
        return call(self, fn, list(args), dict(kwargs))

    def iterate(self, v):
        from .builtins import iterate
        return iterate(self, v)

    def truth(self, v) -> bool:
        from .builtins import truth
        return truth(self, v)

    def binary(self, op, a, b):
        from .handlers.ops import binary
        return binary(self, op, a, b)

    def unary(self, op, a):
        from .handlers.ops import unary
        return unary(self, op, a)

    def getitem(self, c, k):
        from .handlers.ops import getitem
        return getitem(self, c, k)

    # ---- errors -------------------------------------------------------------------------
    def site(self) -> tuple:
        """The root frame's current instruction (index, visit) and location: where a graph break
        goes when the value made here is refused later (the residual code cannot rebuild it)."""
        root = self.frames[0]
        ins = root.instrs[root.pc - 1]
        return ((root.pc - 1, self.visits.get(root.pc - 1, 1)),
                f"{root.code.co_filename}:{ins.lineno or root.code.co_firstlineno}")

    def location(self) -> str | None:
        if not self.frames:
            return None
        f = self.frames[-1]
        ins = f.instrs[f.pc - 1] if f.pc else f.instrs[0]
        return f"{f.code.co_filename}:{ins.lineno or f.code.co_firstlineno}"

    def unsupported(self, reason: str, hint: str | None = None) -> Unsupported:
        loc, line = self.location(), None
        if self.frames:
            import linecache
            f = self.frames[-1]
            ins = f.instrs[f.pc - 1] if f.pc else f.instrs[0]
            line = linecache.getline(f.code.co_filename, ins.lineno or 0) or None
        stack = " <- ".join(fr.code.co_qualname for fr in reversed(self.frames[:-1]))
        if stack:
            reason = f"{reason} (inlined from {stack})"
        return Unsupported(reason, location=loc, source_line=line,
                           hint=hint or "run this code eagerly (ember.disable) or rewrite it")

    # ---- guards -------------------------------------------------------------------------
    def guard(self, kind: str, source: Source | None, expected) -> None:
        if source is None or isinstance(source, ConstSource) and kind not in ("TENSOR",):
            if kind != "GLOBAL_STATE":
                return
        if source is not None and kind != "TENSOR" and source.unguarded:
            return
        key = (kind, source.expr() if source is not None else None)
        if key in self._guard_keys:
            return
        self._guard_keys.add(key)
        self.guards.append(Guard(kind, source, expected))

    def bind_const(self, obj, hint="k") -> str:
        """Put a real object into the generated code's namespace; returns its name."""
        key = (id(obj), hint)
        name = self._const_names.get(key)
        if name is not None:
            return name
        self._n_const += 1
        name = f"__{hint}{self._n_const}"
        self.ns[name] = obj
        self._const_names[key] = name
        self.keepalive.append(obj)
        return name

    def item_source(self, base: Source, key, frozen: bool = False) -> ItemSource:
        """`base[key]`, the key bound in the generated namespace when repr cannot spell it
        (`frozen`: the container is immutable, see ItemSource)."""
        from .sources import plain_repr
        return ItemSource(base, key, None if plain_repr(key) is not None else
                          self.bind_const(key, "key"), frozen=frozen)

    def gid_for(self, gdict: dict) -> str:
        gid = self.global_ids.get(id(gdict))
        if gid is None:
            gid = f"G{len(self.global_ids)}"
            self.global_ids[id(gdict)] = gid
            self.ns[gid] = gdict
        return gid

    # ---- globals ------------------------------------------------------------------------
    def load_global(self, frame: Frame, name: str) -> V:
        g = frame.globals
        key = (frame.gid, name)
        ov = self.overlay.get((id(g), name))
        if ov is not None:
            return ov
        if name in g:
            value = g[name]
            src = GlobalSource(frame.gid, name)
            if _is_library(g.get("__name__")) and not isinstance(value, torch.Tensor):
                # library module state (functions, registries, closures) is treated as stable:
                # an unguarded source (writes through it still replay), no per-call guards
                if is_literal(value) or isinstance(value, (list, dict, tuple)):
                    return ObjV(value, None)
                return self.wrap(value, GlobalSource(frame.gid, name, library=True),
                                 guard_obj=False)
            return self.wrap(value, src)
        b = g.get("__builtins__", builtins)
        b = b if isinstance(b, dict) else b.__dict__
        if name in b:
            return ObjV(b[name])
        del key
        raise self.unsupported(f"name {name!r} is not defined")

    # ---- graph building -----------------------------------------------------------------
    def to_node(self, v):
        if isinstance(v, TensorV):
            return v.node
        if isinstance(v, ObjV):
            x = v.value
            if _holds_sym(x):
                return self._sym_arg(x)
            if not _graph_constant(x):
                raise self.unsupported(f"a {type(x).__module__}.{type(x).__qualname__} object "
                                       "as an argument in the graph",
                                       hint="NumPy is not traced: the call runs eagerly")
            return x
        if isinstance(v, (ListV, TupleV)):
            items = [self.to_node(i) for i in v.items]
            return items if isinstance(v, ListV) else tuple(items)
        if isinstance(v, DictV):
            return {k: self.to_node(x) for k, x in v.items.items()}
        raise self.unsupported(f"cannot pass {type(v).__name__} {v!r:.60} to a torch function")

    def _sym_arg(self, x):
        """`x` with each symbolic size in it (also inside tuples, lists and slices: `t[:n]`,
        `t[:, :n]`) replaced by the graph node computing it."""
        if isinstance(x, (torch.SymInt, torch.SymFloat)):
            return self.size_node(x)
        if isinstance(x, slice):
            return slice(self._sym_arg(x.start), self._sym_arg(x.stop), self._sym_arg(x.step))
        if isinstance(x, (tuple, list)):
            items = [self._sym_arg(i) for i in x]
            return tuple(items) if isinstance(x, tuple) else items
        return x

    def to_meta(self, v):
        if isinstance(v, TensorV):
            return v.meta
        if isinstance(v, ObjV):
            x = v.value
            if isinstance(x, torch.device):
                return torch.device("meta")
            if type(x) is slice:
                return x
            return x
        if isinstance(v, (ListV, TupleV)):
            items = [self.to_meta(i) for i in v.items]
            return items if isinstance(v, ListV) else tuple(items)
        if isinstance(v, DictV):
            return {k: self.to_meta(x) for k, x in v.items.items()}
        raise self.unsupported(f"cannot pass {type(v).__name__} to a torch function")

    def call_graph(self, target, args: list, kwargs: dict) -> V:
        """Record `target(*args, **kwargs)` in the graph; run it on meta for the result."""
        device = _result_device(args, kwargs)
        if self.autocast and getattr(target, "__name__", None) in AUTOCAST_LOWER:
            # autocast as explicit casts in the graph: backends trace on meta tensors, which
            # have no autocast dispatch key, so the graph must not rely on it
            dtype = self.autocast.get(device.type)
            if dtype is not None:
                args = [self._autocast_arg(a, dtype) for a in args]
                kwargs = {k: self._autocast_arg(x, dtype) for k, x in kwargs.items()}
        if any(isinstance(a, TensorV) for a in args):
            args = [_numpy_number(a) for a in args]
        if isinstance(kwargs.get("dtype"), ObjV) and kwargs["dtype"].value in PY_DTYPES:
            # torch.tensor(0, dtype=int) (transformers' caches): the graph's code cannot spell
            # the Python type, so the dtype it stands for
            kwargs = {**kwargs, "dtype": ObjV(PY_DTYPES[kwargs["dtype"].value])}
        margs = [self.to_meta(a) for a in args]
        mkw = {k: self.to_meta(x) for k, x in kwargs.items()}
        real = None
        if "device" in mkw and mkw["device"] is not None:
            mkw["device"] = torch.device("meta")
        if target in _TO_METHODS:
            margs = [("meta" if isinstance(a, str) and _is_device_str(a) else a) for a in margs]
        try:
            memo = _memo_key(target, margs, mkw)
            if memo is not None and memo in _META_MEMO:
                size, stride, dtype = _META_MEMO[memo]
                out = torch.empty_strided(size, stride, dtype=dtype, device="meta")
            elif _has_tensor(margs) or _has_tensor(mkw):
                out = target(*margs, **mkw)
                if memo is not None and type(out) is torch.Tensor and not out.requires_grad \
                        and len(_META_MEMO) < 4096:
                    _META_MEMO[memo] = (tuple(out.shape), tuple(out.stride()), out.dtype)
            else:
                with torch.device("meta"):      # factories: allocate on meta
                    out = target(*margs, **mkw)
                out, real = numbers.factory_result(self, target, args, kwargs, out)
        except Unsupported:
            raise
        except NotImplementedError as e:
            raise self.unsupported(f"{_fname(target)} has no meta implementation "
                                   f"or depends on tensor data: {str(e).splitlines()[0]}")
        except RuntimeError as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "item() cannot be called on meta" in msg and \
                    (sub := numbers.as_numbers(self, args, kwargs)) is not None:
                return self.call_graph(target, *sub)     # a known tensor read as a number
            if "meta" in msg or "data-dependent" in msg or "Cannot" in msg:
                raise self.unsupported(f"{_fname(target)} depends on tensor data ({msg})")
            raise self.unsupported(f"{_fname(target)} raised at trace time: {msg}",
                                   hint="the same call fails eagerly")
        except (TypeError, ValueError, IndexError) as e:
            raise self.unsupported(f"{_fname(target)} raised {type(e).__name__} at trace time: {e}",
                                   hint="the same call fails eagerly")
        if real is numbers.LIFT:
            return numbers.lift_symbols(self, target, args, kwargs)
        v = self._result(target, args, kwargs, out, margs, mkw, device)
        if real is not None and isinstance(v, TensorV):
            numbers.remember(self, v.node, real)
        elif self.known or self.known_sizes:
            numbers.after_op(self, target, args, kwargs, v, _writes(target))
        return v

    def _autocast_arg(self, v, dtype):
        if isinstance(v, TensorV) and v.meta.is_floating_point() and v.meta.dtype != dtype:
            node = self.graph.call_function(torch.Tensor.to, (v.node, dtype))
            node.meta["example_value"] = meta = v.meta.to(dtype)
            return TensorV(node, meta, v.device)
        if isinstance(v, (ListV, TupleV)):
            items = [self._autocast_arg(i, dtype) for i in v.items]
            return ListV(items) if isinstance(v, ListV) else TupleV(items)
        return v

    def _result(self, target, args, kwargs, out, margs, mkw, device):
        if not _has_tensor(out) and not (out is None and _writes(target)):
            return self.const_value(out)
        # in-place / out= results keep the identity of their input value
        node = self.graph.call_function(target, tuple(self.to_node(a) for a in args),
                                        {k: self.to_node(x) for k, x in kwargs.items()})
        node.meta["example_value"] = out
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, TensorV) and a.meta is out:
                return a
        if isinstance(out, torch.Tensor):
            return TensorV(node, out, device, cls=_tensor_cls(out))
        if isinstance(out, (tuple, list)):
            items = []
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    g.meta["example_value"] = o
                    items.append(TensorV(g, o, device, cls=_tensor_cls(o)))
                else:
                    items.append(self.const_value(o))
            if isinstance(out, list):
                return ListV(items)
            return TupleV(items, cls=type(out))
        if out is None:
            return ObjV(None)
        raise self.unsupported(f"{_fname(target)} returned {type(out).__name__}")

    def const_value(self, x) -> V:
        """A value for a trace-time result that holds no tensor."""
        if isinstance(x, list):
            return ListV([self.const_value(i) for i in x])
        if type(x) is tuple:
            return TupleV([self.const_value(i) for i in x])
        if type(x) is dict:
            return DictV({k: self.const_value(i) for k, i in x.items()})
        if isinstance(x, torch.Tensor):
            raise self.unsupported("a real tensor appeared as a constant")
        if type(x) in (set, list, dict, bytearray):
            self.own(x)
        return ObjV(x)

    def own(self, x):
        """`x` was created by the trace itself: mutating it at trace time is safe."""
        self.owned.add(id(x))
        self.keepalive.append(x)
        if self.frames and self.frames[-1].generator:
            self.owned_in_generator.add(id(x))

    def wrote_owned(self, x) -> None:
        """A write to `x`, a container the trace made: counted (see `writes`) unless a
        generator made it, as its private state (named_modules' memo)."""
        if id(x) not in self.owned_in_generator:
            self.writes += 1

    # ---- frames -------------------------------------------------------------------------
    def run_frame(self, frame: Frame) -> V:
        return self._run(frame).value

    def resume_generator(self, g) -> V:
        """Run generator `g` to its next `yield`: the yielded value, or STOP once it returns."""
        from .values import STOP
        if g.done:
            return STOP
        if any(f is g.frame for f in self.frames):
            raise self.unsupported("generator already executing", hint="fails eagerly")
        if g.started:
            g.frame.push(ObjV(None))        # what the paused `yield` evaluates to (next, not send)
        g.started = True
        try:
            r = self._run(g.frame)
        except BaseException:
            g.done = True
            raise
        if isinstance(r, Yield):
            return r.value
        g.done, g.ret = True, r.value
        return STOP

    def check_abandoned_generators(self) -> None:
        """A generator left paused inside a try/finally or with-block: eager closes it when
        it is dropped, running that cleanup code, which the trace would skip."""
        for g in self.generators:
            if g.started and not g.done:
                instrs, table = decode(g.frame.code)
                i = g.frame.pc - 1
                if any(e.start <= i <= e.end and instrs[e.target].opname not in
                       ("CALL_INTRINSIC_1", "CLEANUP_THROW") for e in table):
                    raise self.unsupported(f"generator {g.frame.code.co_qualname} left paused "
                                           "inside a try or with block (its cleanup would not run)")

    def _run(self, frame: Frame) -> Return:
        from .handlers import HANDLERS
        if len(self.frames) >= MAX_INLINE_DEPTH:
            raise self.unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} frames")
        root = not self.frames
        self.frames.append(frame)
        try:
            instrs = frame.instrs
            visits = self.visits
            n = 0
            while True:
                ins = instrs[frame.pc]
                if root:
                    # the root frame counts visits per instruction: a graph break is the
                    # n-th arrival at one instruction, and the retrace stops right there
                    n = visits[frame.pc] = visits.get(frame.pc, 0) + 1
                    if self.stop_at is not None and self.stop_at == (frame.pc, n):
                        raise StopTrace(frame)
                frame.pc += 1
                h = HANDLERS.get(ins.opname)
                try:
                    if h is None:
                        raise self.unsupported(f"bytecode {ins.opname} is not supported")
                    r = h(self, frame, ins)
                except TracedRaise as e:
                    self._unwind(frame, e)       # jumps to the handler or re-raises
                    continue
                except Unsupported as e:
                    if root and e.break_at is None:
                        e.break_at = (frame.pc - 1, n)
                        e.break_location = self.location()
                    raise
                if r is not None:
                    return r
        finally:
            self.frames.pop()

    def _unwind(self, frame: Frame, e: "TracedRaise") -> None:
        """A traced `raise`: continue at the frame's exception handler (3.11+ table)."""
        i = frame.pc - 1
        for ent in decode(frame.code)[1]:
            if ent.start <= i <= ent.end:
                del frame.stack[ent.depth:]
                if ent.lasti:
                    frame.push(ObjV(frame.instrs[i].offset))
                frame.push(ObjV(e.exc))
                frame.pc = ent.target
                return
        raise e

    def inline(self, code: CodeType, globals_: dict, closure: tuple, args: list, kwargs: dict,
               defaults: tuple, kwdefaults: dict, fn_v: V | None = None, name="") -> V:
        """Call a Python function symbolically: bind its arguments and run its bytecode."""
        if code.co_flags & 0x80 or code.co_flags & 0x100 or code.co_flags & 0x200:
            raise self.unsupported(f"coroutine/async generator {code.co_qualname}")
        locals_ = self.bind_args(code, args, kwargs, defaults, kwdefaults)
        cells = {}
        for i, name_ in enumerate(code.co_freevars):
            cells[name_] = closure[i]
        frame = Frame(code, locals_, cells, globals_, self.gid_for(globals_), fn_v)
        if code.co_flags & CO_GENERATOR:
            # its body runs only as it is iterated, interleaved with the consumer's code
            from .values import GenV
            frame.generator = True
            g = GenV(frame)
            self.generators.append(g)
            return g
        return self.run_frame(frame)

    def bind_args(self, code, args, kwargs, defaults, kwdefaults) -> dict:
        n = code.co_argcount
        nk = code.co_kwonlyargcount
        names = code.co_varnames
        posonly = code.co_posonlyargcount
        locals_: dict = {}
        args = list(args)
        kwargs = dict(kwargs)
        for i in range(min(n, len(args))):
            locals_[names[i]] = args[i]
        extra = args[n:]
        idx = n + nk
        if code.co_flags & CO_VARARGS:
            locals_[names[idx]] = TupleV(extra)
            idx += 1
        elif extra:
            raise self.unsupported(f"{code.co_qualname}() takes {n} positional arguments "
                                   f"but {len(args)} were given", hint="the call fails eagerly")
        for i in range(len(args), n):
            nm = names[i]
            if nm in kwargs and i >= posonly:
                locals_[nm] = kwargs.pop(nm)
            elif i >= n - len(defaults):
                locals_[nm] = defaults[i - (n - len(defaults))]
            else:
                raise self.unsupported(f"{code.co_qualname}() missing argument {nm!r}",
                                       hint="the call fails eagerly")
        for i in range(n, n + nk):
            nm = names[i]
            if nm in kwargs:
                locals_[nm] = kwargs.pop(nm)
            elif nm in kwdefaults:
                locals_[nm] = kwdefaults[nm]
            else:
                raise self.unsupported(f"{code.co_qualname}() missing keyword argument {nm!r}",
                                       hint="the call fails eagerly")
        if code.co_flags & CO_VARKEYWORDS:
            locals_[names[idx]] = DictV(kwargs)
        elif kwargs:
            raise self.unsupported(f"{code.co_qualname}() got unexpected keyword arguments "
                                   f"{sorted(kwargs)}", hint="the call fails eagerly")
        return locals_

    def real_function_parts(self, fn: types.FunctionType, fn_v: V):
        """(closure cells, defaults, kwdefaults) values for inlining a real function."""
        src = fn_v.source if fn_v is not None else None
        closure = ()
        if fn.__closure__:
            cells = []
            for i, c in enumerate(fn.__closure__):
                cells.append(self.real_cell(c, ClosureSource(src, i) if src else None))
            closure = tuple(cells)
        # a tensor default is read through the function (`f.__defaults__ = ...` recompiles)
        if src is None and any(isinstance(d, torch.Tensor) for d in (
                *(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values())):
            src = ConstSource(self.bind_const(fn, "f"))     # a method found on its class
        dsrc = AttrSource(src, "__defaults__") if src is not None else None
        kwsrc = AttrSource(src, "__kwdefaults__") if src is not None else None
        defaults = tuple(self.default_value(d, dsrc and ItemSource(dsrc, i, frozen=True))
                         for i, d in enumerate(fn.__defaults__ or ()))
        kwd = {k: self.default_value(d, kwsrc and ItemSource(kwsrc, k))
               for k, d in (fn.__kwdefaults__ or {}).items()}
        return closure, defaults, kwd

    def default_value(self, d, source=None) -> V:
        if isinstance(d, torch.Tensor):
            return self.wrap_tensor(d, source)
        if is_literal(d) or d is None:
            return ObjV(d)
        return self.wrap(d, None)

    def real_cell(self, c, source) -> CellV:
        v = self.real_cells.get(id(c))
        if v is None:
            v = self.real_cells[id(c)] = CellV(real=c, source=source)
            self.keepalive.append(c)
        return v

    def cell_get(self, cell: CellV) -> V:
        if cell.contents is not None:
            return cell.contents
        if cell.real is not None:
            try:
                value = cell.real.cell_contents
            except ValueError:
                raise self.unsupported("free variable referenced before assignment")
            v = self.wrap(value, cell.source) if cell.source is not None else self.wrap(value, None)
            cell.contents = v
            return v
        raise self.unsupported("free variable referenced before assignment")


_TO_METHODS = {torch.Tensor.to}
# ops autocast runs in the lower-precision dtype (CUDA and CPU "lower_precision_fp" lists)
AUTOCAST_LOWER = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d", "linear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm",
                  "__matmul__", "__rmatmul__", "scaled_dot_product_attention", "prelu", "chain_matmul",
                  "conv_tbc", "addmv", "addr", "mv", "einsum"}


_SIDE_EFFECT_FNS = {operator.setitem, torch.Tensor.__setitem__}

# Norms whose meta kernels are Python decompositions (~10 ms a call, the bulk of a warm start's
# capture of a CNN or a transformer): each returns one fresh tensor fixed by its arguments'
# metadata, so the result's shape, strides and dtype are reused for the same metadata.
# {function: position of its `training` argument (a training batch_norm writes its running
# stats: never reused)}
_MEMO_FNS = {torch.batch_norm: 5, torch.nn.functional.batch_norm: 5, torch.layer_norm: None,
             torch.nn.functional.layer_norm: None, torch.group_norm: None,
             torch.nn.functional.group_norm: None}
_META_MEMO: dict = {}


def _memo_key(target, margs, mkw):
    """The reuse key of a call of a _MEMO_FNS function on meta values, or None."""
    try:
        if target not in _MEMO_FNS:
            return None
    except TypeError:       # unhashable target
        return None
    training = _MEMO_FNS[target]
    if training is not None and (margs[training] if len(margs) > training
                                 else mkw.get("training", False)) is not False:
        return None
    grad = torch.is_grad_enabled()
    parts = [target, grad]
    for name, v in [(None, a) for a in margs] + sorted(mkw.items()):
        if isinstance(v, torch.Tensor):
            if type(v) is not torch.Tensor or (grad and v.requires_grad) or \
                    any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride())):
                return None
            v = (tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype)
        elif isinstance(v, (int, float, bool, type(None), torch.dtype)):
            v = (type(v), v)
        elif not (isinstance(v, (list, tuple)) and all(type(i) is int for i in v)):
            return None
        parts.append((name, tuple(v) if isinstance(v, list) else v))
    return tuple(parts)


def _writes(target) -> bool:
    """A call whose None result still matters: setitem, an op that mutates (`mylib.copy_`)."""
    return target in _SIDE_EFFECT_FNS or op_writes(target)


def _is_device_str(s: str) -> bool:
    try:
        torch.device(s)
        return True
    except (RuntimeError, TypeError):
        return False


def _result_device(args, kwargs) -> torch.device:
    d = kwargs.get("device")
    if isinstance(d, ObjV) and d.value is not None:
        return torch.device(d.value)
    for a in args:
        if isinstance(a, ObjV) and isinstance(a.value, torch.device):
            return a.value
        if isinstance(a, ObjV) and isinstance(a.value, str) and a.value in ("cuda", "cpu") :
            return torch.device(a.value)
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, TensorV):
            return a.device
        if isinstance(a, (ListV, TupleV)):
            for i in a.items:
                if isinstance(i, TensorV):
                    return i.device
    return torch.get_default_device()


def _holds_sym(x) -> bool:
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        return True
    if isinstance(x, slice):
        return any(map(_holds_sym, (x.start, x.stop, x.step)))
    return isinstance(x, (tuple, list)) and any(map(_holds_sym, x))


def _graph_constant(x) -> bool:
    """Whether the generated graph code can spell `x`: FX prints a constant argument with repr
    (a NumPy array printed as `array([...])` is a NameError at call time) and imports only
    callables and classes."""
    if is_literal(x) or x is None or isinstance(x, SYM_TYPES) or type(x) in (slice, range):
        return True
    if type(x) in (tuple, list):
        return all(_graph_constant(i) for i in x)
    if type(x).__module__ == "numpy" or type(x).__module__.startswith("numpy."):
        return False
    return callable(x) or type(x).__module__.split(".")[0] == "torch"


#: the dtype torch gives a Python type passed as a dtype
PY_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


def _numpy_number(v):
    """A NumPy float or int next to a tensor operand, as the Python number it equals: torch
    promotes the two alike (`x + np.float32(2)` is `x + 2.0`). Not np.bool_ (torch promotes it
    as a float) nor a NumPy number alone (`torch.tensor(np.float64(1))` is float64)."""
    if isinstance(v, ObjV) and type(v.value).__module__ == "numpy":
        import numpy
        if isinstance(v.value, (numpy.floating, numpy.integer)):
            return ObjV(v.value.item())
    return v


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(i) for i in x)
    if isinstance(x, dict):
        return any(_has_tensor(i) for i in x.values())
    return False


def _fname(target) -> str:
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))


def _tensor_cls(meta) -> type:
    """A result's class as isinstance sees it: a traceable subclass's meta copy is that class."""
    return type(meta) if is_traceable_subclass(meta) else torch.Tensor


def func_signature_ok(fn) -> bool:
    try:
        inspect.signature(fn)
        return True
    except (TypeError, ValueError):
        return False


__all__ = ["Tracer", "Frame", "Return", "NULL", "sys"]
