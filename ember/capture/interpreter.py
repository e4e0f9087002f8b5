"""Capture, interpreter: symbolic execution of one frame (and everything it inlines).

Consumes a code object + the caller's real arguments; produces a torch.fx.Graph of torch-level
calls, the guard list, the side effects and the return value as values (values.py). Opcode
behaviour lives in handlers/ (one function per opcode in `HANDLERS`); calls in calls.py,
attribute loads in attrs.py. Tensors run on the meta device (for shapes/dtypes); anything that
needs a tensor's data raises `Unsupported`.
"""
from __future__ import annotations

import builtins
import collections
import dataclasses
import inspect
import operator
import sys
import types
from types import CodeType

import torch
import torch.fx as fx

from .. import shapes
from ..errors import Unsupported
from .bytecode import decode
from .effects import op_writes
from .functorch import is_functorch
from .guards import Guard, global_state
from .sources import (AttrSource, ClosureSource, ConstSource, DictEntrySource, GlobalSource,
                      ItemSource, LocalSource, SizeSource, Source)
from .values import (NULL, SYM_TYPES, CellV, DictV, LazyV, ListV, ObjV, TensorV, TupleV, V,
                     is_literal)

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


class SymbolInput:
    """A size symbol's placeholder among the tracer's inputs (next to TensorV inputs)."""
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node


def _stride_order(t: torch.Tensor) -> list[int]:
    """Dims outermost first (by stride, then size)."""
    return sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d]), reverse=True)


def _first_non_placeholder(graph):
    return next((n for n in graph.nodes if n.op != "placeholder"), None)


class Tracer:
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

    # ---- wrapping real objects ----------------------------------------------------------
    def wrap(self, value, source: Source | None, *, guard_obj: bool = True) -> V:
        """A value for the caller's real object `value` read from `source`, with guards."""
        if source is not None:
            hit = self.by_source.get(source.expr())
            if hit is not None:
                return hit
        v = self._wrap(value, source, guard_obj)
        if source is not None:
            self.by_source[source.expr()] = v
        return v

    def _wrap(self, value, source, guard_obj):
        t = type(value)
        if isinstance(value, torch.Tensor):
            return self.wrap_tensor(value, source)
        if value is None:
            self.guard("NONE", source, None)
            return ObjV(None, source)
        if t is int and self._dynamic_int(value, source):
            self.guard("TYPE", source, int)
            return ObjV(self._shape_env().new_symbol(value, source, guard_bound=True), source)
        if t in (float, str) and source is not None and not source.structural:
            # guarded by value only once used: a loss.item() (or a message made from it) that
            # only gets logged does not recompile per value
            self.guard("TYPE", source, t)
            return LazyV(value, lambda: self.guard("EQ", source, value), source)
        if is_literal(value):
            self.guard("EQ", source, value)
            return ObjV(value, source)
        if t is list or t is dict:
            hit = self.by_real_id.get(id(value))
            if hit is not None:           # one container reached through two sources
                self.guard("ALIAS", source, hit.source)
                return hit
        if t is list or t is tuple or (isinstance(value, tuple) and hasattr(t, "_fields")) \
                or t is torch.Size:
            self.guard("TYPE", source, t)
            self.guard("LEN", source, len(value))
            items = [self.wrap(x, ItemSource(source, i, frozen=t is not list) if source else None)
                     for i, x in enumerate(value)]
            if t is list:
                return self._remember(value, ListV(items, source))
            return TupleV(items, source, cls=t)
        if t is dict or (isinstance(value, dict) and t.__module__ == "collections"):
            self.guard("TYPE", source, t)
            self.guard("KEYS", source, list(value.keys()))
            d = DictV({k: self.wrap(x, self.item_source(source, k) if source else None)
                       for k, x in value.items()}, source, cls=t)
            if t is collections.defaultdict and source is not None:
                d.factory = self.wrap(value.default_factory, AttrSource(source, "default_factory"))
            return self._remember(value, d) if t is dict else d
        if isinstance(value, torch.nn.Module):
            self.guard("TYPE", source, t)
            return ObjV(value, source)
        if t is types.MethodType and source is not None and \
                isinstance(value.__func__, types.FunctionType):
            # a bound method is a new object per attribute read: guard what it binds
            from .values import MethodV
            self.guard("TYPE", source, t)
            return MethodV(self.wrap(value.__func__, AttrSource(source, "__func__")),
                           self.wrap(value.__self__, AttrSource(source, "__self__")), source)
        if t is types.FunctionType and guard_obj and source is not None and \
                not source.structural and is_functorch(value):
            # torch.func's wrapper of a user function, new per transform call; calling it breaks
            self.guard("TYPE", source, t)
            self.guard("ID", AttrSource(source, "__code__"), value.__code__)
            return LazyV(value, lambda: self.guard("ID", source, value), source)
        if t is types.FunctionType and guard_obj and source is not None and \
                not source.structural and not value.__dict__ and \
                (value.__closure__ is not None or "<locals>" in value.__qualname__):
            self._guard_closure(value, source)
            # which object it is counts only where identity is used (`is`, `==`, a dict key):
            # there the read installs the ID guard; calls read it without (calls.call_obj)
            return LazyV(value, lambda: self.guard("ID", source, value), source)
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type,
                              types.ModuleType, types.MethodType)) or callable(value) and \
                t.__module__.startswith("torch"):
            if guard_obj:
                self.guard("ID", source, value)
            return ObjV(value, source)
        if dataclasses.is_dataclass(value) or t.__module__ not in ("builtins",):
            self.guard("TYPE", source, t)
            return ObjV(value, source)
        if t in (set, frozenset):
            # a copy: the guard compares the set's contents then with the caller's set later
            self.guard("EQ", source, frozenset(value) if t is frozenset else set(value))
            return ObjV(value, source)
        self.guard("TYPE", source, t)
        return ObjV(value, source)

    def _guard_closure(self, fn: types.FunctionType, source: Source) -> None:
        """A nested function or closure is a new object each time its maker runs (a resume
        function gets one per call): guard what an inlined call reads — its code, defaults and
        kwdefaults, no attributes (ember.allow_in_graph marks) — not the object. The cells'
        contents are guarded where the trace reads them."""
        self.guard("TYPE", source, types.FunctionType)
        self.guard("ID", AttrSource(source, "__code__"), fn.__code__)
        self.guard("LEN", AttrSource(source, "__dict__"), 0)
        for name in ("__defaults__", "__kwdefaults__"):
            d = getattr(fn, name)
            plain = d is None or is_literal(d) or type(d) is dict and all(map(is_literal, d.values()))
            self.guard("NONE" if d is None else "EQ" if plain else "ID", AttrSource(source, name), d)

    def _remember(self, value, v):
        if v.source is not None:
            self.by_real_id[id(value)] = v
            self.keepalive.append(value)
        return v

    def wrap_tensor(self, value: torch.Tensor, source: Source | None) -> TensorV:
        hit = self.by_real_id.get(id(value))
        if hit is not None:
            if source is not None and hit.source is not None and source.expr() != hit.source.expr() \
                    and source.structural == hit.source.structural:
                self.guard("ALIAS", source, hit.source)
            return hit
        if source is None:
            source = ConstSource(self.bind_const(value, "t"))
        if value.layout != torch.strided or value.is_quantized or value.is_nested:
            raise self.unsupported(f"tensor with layout {value.layout}")
        if type(value) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
                value, torch.nn.parameter.Buffer if hasattr(torch.nn.parameter, "Buffer") else ()):
            raise self.unsupported(f"tensor subclass {type(value).__name__}")
        dims = self._dynamic_dims_of(value, source)
        if dims:
            meta, shape, stride = self._symbolic_meta(value, source, dims)
        else:
            meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
            shape, stride = tuple(value.shape), value.stride()
        if value.requires_grad:
            meta.requires_grad_(True)
        self.guard("TENSOR", source, (type(value), value.dtype, value.device, shape, stride,
                                      value.requires_grad))
        node = self.graph.placeholder(_placeholder_name(source, len(self.inputs)))
        node.meta["example_value"] = meta
        node.meta["ember_source"] = source.name()
        tv = TensorV(node, meta, value.device, source, cls=type(value))
        self.inputs.append((source, tv, value))
        self.by_real_id[id(value)] = tv
        self.keepalive.append(value)
        return tv

    # ---- dynamic shapes -------------------------------------------------------------------
    def _dynamic_dims_of(self, value: torch.Tensor, source: Source) -> list[int]:
        """Dims of an input tensor to trace symbolically: asked for (dynamic=True, automatic
        dynamic, ember.mark_dynamic) and not ember.mark_static, size >= 2, and a dense layout
        (strides follow sizes)."""
        if self.settings is None or self.settings.dynamic is False or source.structural \
                or isinstance(value, torch.nn.Parameter):
            return []
        want = self.dynamic_dims.get(source.expr(), set())
        if self.settings.dynamic is True:
            want = range(value.dim())
        want = (set(want) | set(getattr(value, "_ember_dynamic_dims", ()))) - \
            set(getattr(value, "_ember_static_dims", ()))           # ember.mark_static wins
        dims = [d for d in sorted(d for d in want if isinstance(d, int))   # not the "value" mark
                if d < value.dim() and value.shape[d] >= shapes.LOWER_BOUND]
        if dims and shapes.row_major_strides(list(value.shape), _stride_order(value)) != \
                list(value.stride()):
            return []       # not dense, or size-1 dims with strides the sizes do not give
        return dims

    def _dynamic_int(self, value: int, source: Source | None) -> bool:
        """An int argument traced as a size symbol: it changed between calls (automatic
        dynamic) or dynamic=True; 0 and 1 stay constants."""
        if source is None or self.settings is None or self.settings.dynamic is False or \
                source.structural or source.unguarded or value < shapes.LOWER_BOUND:
            return False
        return self.settings.dynamic is True and isinstance(source, LocalSource) or \
            "value" in self.dynamic_dims.get(source.expr(), ())

    def _shape_env(self) -> shapes.ShapeEnv:
        if self.shape_env is None:
            self.shape_env = shapes.ShapeEnv()
        return self.shape_env

    def _symbolic_meta(self, value: torch.Tensor, source: Source, dims: list[int]):
        env = self._shape_env()
        sizes = [env.new_symbol(n, SizeSource(source, d)) if d in dims else n
                 for d, n in enumerate(value.shape)]
        # strides in terms of sizes: row-major in the order of the real strides
        order = _stride_order(value)
        meta = torch.empty_strided(sizes, shapes.row_major_strides(sizes, order),
                                   dtype=value.dtype, device="meta")
        return meta, tuple(None if d in dims else n for d, n in enumerate(value.shape)), \
            tuple(order)

    def size_node(self, x):
        """A graph value for a SymInt: nodes computing its expression from the symbol inputs."""
        return shapes.to_fx(self.graph, shapes.expr_of(x), self._symbol_node, self._size_nodes)

    def size_expr(self, x) -> str:
        """Python source computing a SymInt from the frame's locals (for rebuilt outputs)."""
        env = self.shape_env
        return shapes.pyexpr(shapes.expr_of(x), lambda s: env.sources[s].expr())

    def shape_guards(self) -> list[Guard]:
        """The relations the trace (capture and backend) assumed about the symbols."""
        env = self.shape_env
        if env is None:
            return []
        out = []
        for g in env.guards:
            code = shapes.pyexpr(g, lambda s: env.sources[s].expr())
            text = shapes.pyexpr(g, lambda s: env.sources[s].name())
            out.append(Guard("SHAPE", None, (code, text)))
        return out

    def _symbol_node(self, sym):
        node = self._symbol_nodes.get(sym)
        if node is None:
            src = self.shape_env.sources[sym]
            with self.graph.inserting_before(_first_non_placeholder(self.graph)):
                node = self.graph.placeholder(str(sym))
            node.meta["example_value"] = self.shape_env.symint(sym)
            node.meta["ember_source"] = src.name()
            self._symbol_nodes[sym] = node
            self.inputs.append((src, SymbolInput(node), self.shape_env.hints[sym]))
        return node

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
            if isinstance(x, (torch.SymInt, torch.SymFloat)):
                return self.size_node(x)
            if isinstance(x, (tuple, list)) and any(isinstance(i, torch.SymInt) for i in x):
                items = [self.size_node(i) if isinstance(i, torch.SymInt) else i for i in x]
                return tuple(items) if type(x) is tuple else items
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
        margs = [self.to_meta(a) for a in args]
        mkw = {k: self.to_meta(x) for k, x in kwargs.items()}
        if "device" in mkw and mkw["device"] is not None:
            mkw["device"] = torch.device("meta")
        if target in _TO_METHODS:
            margs = [("meta" if isinstance(a, str) and _is_device_str(a) else a) for a in margs]
        try:
            if _has_tensor(margs) or _has_tensor(mkw):
                out = target(*margs, **mkw)
            else:
                with torch.device("meta"):      # factories: allocate on meta
                    out = target(*margs, **mkw)
        except Unsupported:
            raise
        except NotImplementedError as e:
            raise self.unsupported(f"{_fname(target)} has no meta implementation "
                                   f"or depends on tensor data: {str(e).splitlines()[0]}")
        except RuntimeError as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "meta" in msg or "data-dependent" in msg or "Cannot" in msg:
                raise self.unsupported(f"{_fname(target)} depends on tensor data ({msg})")
            raise self.unsupported(f"{_fname(target)} raised at trace time: {msg}",
                                   hint="the same call fails eagerly")
        except (TypeError, ValueError, IndexError) as e:
            raise self.unsupported(f"{_fname(target)} raised {type(e).__name__} at trace time: {e}",
                                   hint="the same call fails eagerly")
        return self._result(target, args, kwargs, out, margs, mkw, device)

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
            return TensorV(node, out, device)
        if isinstance(out, (tuple, list)):
            items = []
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    g.meta["example_value"] = o
                    items.append(TensorV(g, o, device))
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


def _placeholder_name(source: Source, i: int) -> str:
    import re
    name = source.name()
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_")
    name = re.sub(r"^(L_|G_)", "", name)
    name = name or f"arg{i}"
    return name if len(name) <= 48 else f"{name[:24]}_{name[-20:]}_{i}"


def func_signature_ok(fn) -> bool:
    try:
        inspect.signature(fn)
        return True
    except (TypeError, ValueError):
        return False


__all__ = ["Tracer", "Frame", "Return", "NULL", "sys"]
