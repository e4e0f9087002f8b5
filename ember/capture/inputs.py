"""Capture, inputs: the caller's real objects as values, and which of their sizes are symbolic.

`Inputs.wrap(value, source)` turns an object the trace reads from the caller (a local, a
global, an attribute, an item) into a value with the guards that pin what the trace assumed:
constants by value, containers item by item, functions and modules by identity (a closure by
its code), tensors as graph placeholders with a TENSOR guard. Dynamic shapes: the dims of an
input tensor (and int arguments) traced as size symbols (dynamic=True, automatic dynamic,
ember.mark_dynamic), with the guards on the relations the trace assumed. A mixin of Tracer
(interpreter.py), which supplies guard/unsupported/bind_const and the input lists.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import types

import torch

from .. import shapes
from ..errors import Unsupported
from .functorch import is_functorch
from .guards import Guard
from .sources import AttrSource, ConstSource, ItemSource, LocalSource, SizeSource, Source
from .subclasses import guard_inner, is_traceable_subclass, meta_copy
from .values import DictV, LazyV, ListV, NewObjV, ObjV, TensorV, TupleV, V, is_literal, \
    is_model_output


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


def _placeholder_name(source: Source, i: int) -> str:
    name = source.name()
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_")
    name = re.sub(r"^(L_|G_)", "", name)
    name = name or f"arg{i}"
    return name if len(name) <= 48 else f"{name[:24]}_{name[-20:]}_{i}"


class Inputs:
    """Tracer's reading of the caller's objects (see the module docstring)."""

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
        if t is list or t is dict or t is set:
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
        if source is not None and is_model_output(t) and dataclasses.is_dataclass(t):
            mo = self._wrap_model_output(value, source)
            if mo is not None:
                return mo
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
            return self._remember(value, ObjV(value, source)) if t is set else ObjV(value, source)
        self.guard("TYPE", source, t)
        return ObjV(value, source)

    def _wrap_model_output(self, value, source: Source) -> NewObjV | None:
        """A transformers ModelOutput from the caller (an argument, a resume function's local)
        as the value a ModelOutput made in the trace is: its fields, read through attribute
        sources, so `out[0]`, `out["k"]`, `to_tuple()`, `keys()` and iteration trace. Guarded
        on its type, its keys and each field. Only when it is in the state ModelOutput's own
        setters keep (the mapping's items are the non-None fields, the same objects; no other
        instance attributes); otherwise an object (reads of its mapping break). The trace
        refuses writes to it (attrs.store_attr, ops.setitem), so residual code hands the
        caller's own object on."""
        hit = self.by_real_id.get(id(value))
        if hit is not None:
            self.guard("ALIAS", source, hit.source)
            return hit
        names = [f.name for f in dataclasses.fields(value)]
        inst = vars(value)
        keys = list(value.keys())
        if set(inst) != set(names) or keys != [n for n in names if inst[n] is not None] or \
                any(dict.__getitem__(value, k) is not inst[k] for k in keys):
            return None
        self.guard("TYPE", source, type(value))
        self.guard("KEYS", source, keys)
        try:
            attrs = {n: self.wrap(inst[n], AttrSource(source, n)) for n in names}
        except Unsupported:             # a field the trace cannot hold: read it as an object
            return None
        v = NewObjV(type(value), attrs, dataclass=True)
        v.source = source
        return self._remember(value, v)

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
        sub = is_traceable_subclass(value)
        if not sub and type(value) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
                value, torch.nn.parameter.Buffer if hasattr(torch.nn.parameter, "Buffer") else ()):
            raise self.unsupported(f"tensor subclass {type(value).__name__} (it does not "
                                   "implement __tensor_flatten__/__tensor_unflatten__)")
        dims = [] if sub else self._dynamic_dims_of(value, source)
        if dims:
            meta, shape, stride = self._symbolic_meta(value, source, dims)
        else:
            meta = meta_copy(value)          # a subclass: rebuilt around meta inner tensors
            shape, stride = tuple(value.shape), value.stride()
        if value.requires_grad:
            meta.requires_grad_(True)
        if sub:
            guard_inner(self, value, source)
        self.guard("TENSOR", source, (type(value), value.dtype, value.device, shape, stride,
                                      value.requires_grad, value.is_neg()))
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
                source.unguarded or value < shapes.LOWER_BOUND:
            return False
        # a module's int attribute only once it changed (read again when the module changes)
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
        # each symbol's source is read once per call, by a first guard that binds it to a local
        # of the check function (the guards are one `and` chain, in this order): written inline,
        # a channel shuffle's 16 relations called `x.size(i)` 85 times, ~40 us a call
        syms = sorted({s for g in env.guards for s in g.free_symbols}, key=str)
        local = {s: f"__z{i}" for i, s in enumerate(syms)}
        if syms:
            binds = ", ".join(f"({local[s]} := {env.sources[s].expr()})" for s in syms)
            out.append(Guard("SHAPE", None, (f"len(({binds},)) == {len(syms)}",
                                             "read once: " + ", ".join(
                                                 env.sources[s].name() for s in syms))))
        for g in env.guards:
            code = shapes.pyexpr(g, local.__getitem__)
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
