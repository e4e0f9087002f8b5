"""Capture, effects: from a finished trace to the graph module and the code that runs after it.

Consumes the tracer (graph, inputs, side effects) and the frame's return value; produces a
`Plan`: the clean fx.GraphModule (placeholders = tensors, module state first), the input
expressions, and Python statements that rebuild the return value from the graph outputs and
replay side effects (attribute writes on argument objects, caller list/dict mutations, global
writes, new dataclass/namedtuple/ModelOutput objects) so the caller sees what eager would.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import types

import torch
import torch.fx as fx

from .dictkeys import TensorKey, has_traced_keys
from .values import (CellV, DictV, DictViewV, FuncV, LazyV, ListV, NdarrayV, NewModuleV, NewObjV,
                     ObjV, PartialV, TensorV, TupleV, V, is_model_output)


@dataclasses.dataclass
class Plan:
    gm: fx.GraphModule | None
    structural_inputs: list        # sources of module-state tensors (fetched on refresh)
    dynamic_inputs: list           # sources fetched on every call
    example_inputs: list
    body: list[str]                # statements after `__o = compiled(...)`; end with `return`
    n_ops: int


def _new_obj(cls, attrs):
    obj = cls.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


_MO_FIELDS: dict = {}


def _function(code, globals_, qualname, defaults, kwdefaults, closure):
    fn = types.FunctionType(code, globals_, code.co_name, defaults or None, closure or None)
    fn.__kwdefaults__, fn.__qualname__ = kwdefaults or None, qualname
    return fn


def _model_output(cls, fields):
    """A transformers ModelOutput equal to `cls(**fields)` when the first field is a tensor:
    every field an attribute, the non-None ones the mapping's items, in field order."""
    defaults = _MO_FIELDS.get(cls)
    if defaults is None:
        defaults = _MO_FIELDS[cls] = [(f.name, f.default) for f in dataclasses.fields(cls)]
    obj = collections.OrderedDict.__new__(cls)
    collections.OrderedDict.__init__(obj)
    d = object.__getattribute__(obj, "__dict__")
    for name, default in defaults:
        d[name] = fields.get(name, default)
    for k, x in fields.items():
        if x is not None:
            collections.OrderedDict.__setitem__(obj, k, x)
    return obj


class Rebuild:
    def __init__(self, tr):
        self.tr = tr
        self.outputs: list[TensorV] = []
        self.out_index: dict = {}
        self.pre: list[str] = []
        self.memo: dict[int, str] = {}
        self.snaps: dict[str, str] = {}

    def bind(self, obj, hint="k"):
        return self.tr.bind_const(obj, hint)

    def expr(self, v: V) -> str:
        if isinstance(v, TensorV):
            if v.source is not None and v.node.op == "placeholder":
                return v.source.expr()
            i = self.out_index.get(v.node)
            if i is None:
                i = len(self.outputs)
                self.out_index[v.node] = i
                self.outputs.append(v)
            return f"__o[{i}]"
        if isinstance(v, LazyV) and v.pending:       # recomputed, so left unguarded
            if v.source is not None:
                return self._snap(v.source.expr())
            return self._call(v, v.fn)
        if isinstance(v, NewModuleV):
            return self._call(v, v.fn)
        if isinstance(v, ObjV):
            x = v.value
            if x is None or type(x) in (bool, int, str) or type(x) is float and math.isfinite(x):
                return repr(x)
            if isinstance(x, torch.SymInt):
                return self._snap(self.tr.size_expr(x))
            if isinstance(x, (tuple, list, torch.Size)) and any(isinstance(i, torch.SymInt) for i in x):
                return self.expr(TupleV([ObjV(i) for i in x], cls=type(x))
                                 if not isinstance(x, list) else ListV([ObjV(i) for i in x]))
            if v.source is not None:
                return v.source.expr()
            if type(x) in (set, list, dict, bytearray) and id(x) in self.tr.owned:
                # made by the trace: a new one per call, as eager makes it
                if self.tr.set_members.get(id(x)):
                    raise self.tr.unsupported("a set holding tensors outlives the graph")
                if id(v) in self.memo:
                    return self.memo[id(v)]
                return self._temp(v, f"{self.bind(x)}.copy()")
            return self.bind(x)
        if id(v) in self.memo:
            return self.memo[id(v)]
        if isinstance(v, ListV):
            if v.source is not None:
                return v.source.expr()
            inner = "[" + ", ".join(self.expr(i) for i in v.items) + "]"
            if v.cls is collections.deque:
                return self._temp(v, f"{self.bind(collections.deque, 'c')}({inner})")
            return self._temp(v, inner)
        if isinstance(v, TupleV):
            if v.source is not None:
                return v.source.expr()
            inner = ", ".join(self.expr(i) for i in v.items)
            if v.cls is tuple:
                return f"({inner}{',' if len(v.items) == 1 else ''})"
            if v.cls is torch.Size:
                return f"{self.bind(torch.Size)}(({inner}{',' if len(v.items) == 1 else ''}))"
            if hasattr(v.cls, "_fields"):
                return f"{self.bind(v.cls, 'c')}({inner})"
            return f"{self.bind(v.cls, 'c')}(({inner},))"
        if isinstance(v, DictV):
            if v.source is not None and id(v) not in self.tr.fresh:
                return v.source.expr()
            inner = ", ".join(f"{self._key(k)}: {self.expr(x)}" for k, x in v.items.items())
            if v.cls is dict:
                return self._temp(v, "{" + inner + "}")
            if v.factory is not None or issubclass(v.cls, collections.defaultdict):
                factory = self.expr(v.factory) if v.factory is not None else "None"
                return self._temp(v, f"{self.bind(v.cls, 'c')}({factory}, {{{inner}}})")
            return self._temp(v, f"{self.bind(v.cls, 'c')}({{{inner}}})")
        if isinstance(v, PartialV):
            args = [self.expr(v.func)] + [self.expr(a) for a in v.args] + \
                [f"**{{{self._key(k)}: {self.expr(x)}}}" for k, x in v.kwargs.items()]
            return self._temp(v, f"{self.bind(functools.partial, 'f')}({', '.join(args)})")
        if isinstance(v, NdarrayV):       # shares the tensor's memory, as eager x.numpy() does
            return self._temp(v, f"{self.expr(v.t)}.numpy()")
        if isinstance(v, DictViewV):      # a view of the dict as rebuilt: live there too
            return f"{self.expr(v.d)}.{v.view}()"
        if isinstance(v, FuncV):          # a closure or lambda made in the trace, made again
            defaults = "".join(self.expr(d) + ", " for d in v.defaults)
            kwdefaults = ", ".join(f"{k!r}: {self.expr(d)}" for k, d in v.kwdefaults.items())
            closure = "".join(self.cell(c) + ", " for c in v.closure)
            return self._temp(v, f"{self.bind(_function, 'f')}({self.bind(v.code, 'code')}, "
                                 f"{self.bind(v.globals, 'g')}, {v.qualname!r}, ({defaults}), "
                                 f"{{{kwdefaults}}}, ({closure}))")
        if isinstance(v, NewObjV):
            if v.source is not None:          # the caller's ModelOutput, never written
                return v.source.expr()
            inner = ", ".join(f"{self._key(k)}: {self.expr(x)}" for k, x in v.attrs.items())
            if v.dataclass:
                first = next(iter(v.attrs.values()), None)
                if is_model_output(v.cls) and isinstance(first, TensorV):
                    # what ModelOutput.__post_init__ builds (tensor first field), minus its cost
                    return self._temp(v, f"{self.bind(_model_output, 'f')}("
                                         f"{self.bind(v.cls, 'c')}, {{{inner}}})")
                return self._temp(v, f"{self.bind(v.cls, 'c')}(**{{{inner}}})")
            return self._temp(v, f"{self.bind(_new_obj, 'f')}({self.bind(v.cls, 'c')}, {{{inner}}})")
        raise self.tr.unsupported(f"returning a {type(v).__name__} from the compiled frame")

    def cell(self, c: CellV) -> str:
        """A real cell for a cell value: the caller's own (read through its source), or a new
        one made once per residual call, shared by every closure rebuilt over it."""
        if id(c) in self.memo:
            return self.memo[id(c)]
        if c.real is not None:
            return c.source.cell_expr() if c.source is not None else self.bind(c.real, "cell")
        name = self._temp(c, f"{self.bind(types.CellType, 'c')}()")
        if c.contents is not None:      # after the memo: a closure may hold its own cell
            self.pre.append(f"{name}.cell_contents = {self.expr(c.contents)}")
        return name

    def _call(self, v, fn) -> str:
        """`fn(*v.args, **v.kwargs)` once per residual call: a value made again, not kept."""
        if id(v) in self.memo:
            return self.memo[id(v)]
        args = [self.expr(a) for a in v.args] + [f"{k}={self.expr(x)}" for k, x in v.kwargs.items()]
        return self._temp(v, f"{self.bind(fn, 'f')}({', '.join(args)})")

    def _snap(self, code: str) -> str:
        """A value read from the caller's state, read once before any effect or eager call
        runs: replayed writes (`o.a, o.b = o.b, o.a`, a `nonlocal` counter) must not change it."""
        name = self.snaps.get(code)
        if name is None:
            name = self.snaps[code] = f"__s{len(self.snaps)}"
            self.pre.append(f"{name} = {code}")
        return name

    def _key(self, k):
        if k is None or type(k) in (bool, int, str):
            return repr(k)
        if isinstance(k, TensorKey):          # a tensor made in the trace: the tensor itself
            return self.expr(k.tv)
        if type(k) is tuple and has_traced_keys(k):
            return "(" + "".join(self._key(i) + ", " for i in k) + ")"
        return self.bind(k)

    def _temp(self, v, code):
        name = f"__r{len(self.memo)}"
        self.memo[id(v)] = name
        self.pre.append(f"{name} = {code}")
        return name


def finalize(tr, ret: V) -> Plan:
    tr.check_abandoned_generators()
    rb = Rebuild(tr)
    ret_expr = rb.expr(ret)
    body = list(rb.pre)
    body.append(f"__ret = {ret_expr}")
    n_pre = len(rb.pre)
    effects = effect_lines(tr, rb)
    if torch.is_grad_enabled() != tr.state0[0]:
        # a resumed frame that leaves a `with no_grad()` block: the mode it returns with
        effects.append(f"{tr.bind_const(torch._C._set_grad_enabled, 'f')}({torch.is_grad_enabled()})")
    # temps created while writing effects must run before them
    body = rb.pre[:n_pre] + [body[n_pre]] + rb.pre[n_pre:] + effects + ["return __ret"]
    gm, structural, dynamic, examples = graph_module(tr, rb.outputs)
    n_ops = sum(1 for n in tr.graph.nodes if n.op == "call_function")
    return Plan(gm, structural, dynamic, examples, body, n_ops)


def effect_lines(tr, rb: Rebuild) -> list[str]:
    """Statements that replay the trace's side effects on the caller's objects, in order."""
    effects: list[str] = []
    for m in tr.mutated:
        if isinstance(m, ListV):
            effects.append(f"{m.source.expr()}[:] = [{', '.join(rb.expr(i) for i in m.items)}]")
        elif isinstance(m, DictV):
            inner = ", ".join(f"{rb._key(k)}: {rb.expr(x)}" for k, x in m.items.items())
            # new contents first: they may be read through the dict itself
            effects.append(f"__v = {{{inner}}}; __d = {m.source.expr()}; __d.clear(); "
                           f"__d.update(__v)")
        elif isinstance(m, ObjV):         # a caller's set, written through its copy
            effects.append(f"__d = {m.source.expr()}; __d.clear(); __d.update({rb.bind(m.value)})")
    for eff in tr.effects:
        if eff[0] == "setattr":
            _, obj_v, name, value, plain = eff
            # a plain store made by a traced user __setattr__ must not run that hook again
            setter = rb.bind(object.__setattr__, "f") if plain else "setattr"
            target = obj_v.source.expr() if obj_v.source is not None else rb.expr(obj_v)
            effects.append(f"{setter}({target}, {name!r}, {rb.expr(value)})")
        elif eff[0] == "delattr":
            _, obj_v, name = eff
            effects.append(f"delattr({obj_v.source.expr()}, {name!r})")
        elif eff[0] == "cell":
            _, cell, value = eff
            effects.append(f"{rb.cell(cell)}.cell_contents = {rb.expr(value)}")
        elif eff[0] == "global":
            _, gid, name, value = eff
            effects.append(f"{gid}[{name!r}] = {rb.expr(value)}")
    return effects


def op_writes(target) -> bool:
    """A torch.ops op that writes an argument: an overload (aten.sigmoid_.default), or a packet
    with such an overload other than an out= one (aten.avg_pool2d_backward has .grad_input)."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(s.is_mutable and not any(a.is_out for a in s.arguments)
                   for s in (getattr(target, o)._schema for o in target.overloads()))
    return False


def mutates_first_arg(node) -> bool:
    name = getattr(node.target, "__name__", "")
    if isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return op_writes(node.target) or "out" in node.kwargs
    return node.op == "call_function" and bool(node.args) and (
        name in ("__setitem__", "setitem") or name.startswith("__i") or
        (name.endswith("_") and not name.startswith("_")) or "out" in node.kwargs)


def guard_mutated_aliases(tr) -> None:
    """A graph that mutates an input treats every input as its own memory. Two caller tensors
    sharing storage with one of them mutated would read stale values: refuse that here, and
    guard the entry on the inputs staying apart."""
    dynamic = [(src, tv, real) for src, tv, real in tr.inputs if not src.structural]
    mutated = {n.args[0] for n in tr.graph.nodes if mutates_first_arg(n)}
    for src, tv, real in dynamic:
        if tv.node not in mutated:
            continue
        # size symbols of a dynamic graph are inputs too, plain ints: they share no memory
        others = [(s, r) for s, t, r in dynamic if t is not tv and isinstance(r, torch.Tensor)]
        if not others:
            continue
        ptr = real.untyped_storage().data_ptr()
        if any(r.untyped_storage().data_ptr() == ptr for _, r in others):
            raise tr.unsupported(f"{src.name()} is mutated and shares memory with another input")
        tr.guard("NO_ALIAS", src, [s for s, _ in others])


def _check_new_leaves(tr, outputs: list[TensorV]) -> None:
    """A graph with `requires_grad_()` leaves (attrs.set_requires_grad) breaks at the first one
    where the compiled graph cannot be eager: it returns the leaf (eager fills that object's
    .grad; the graph returns a copy with a history), or no input requires grad (its outputs
    need a history that only inputs that require grad give a compiled graph)."""
    site, why = next(iter(tr.new_leaves.values())), None
    for o in outputs:
        if o.node in tr.new_leaves:
            site, why = tr.new_leaves[o.node], "requires_grad_() on a tensor the graph makes " \
                "and returns: its .grad is eager's only"
    if why is None and any(o.meta.requires_grad for o in outputs) and not any(
            isinstance(tv, TensorV) and tv.meta.requires_grad for _, tv, _ in tr.inputs):
        why = "requires_grad_() on a tensor the graph makes, and no input requires grad"
    if why is not None:
        e = tr.unsupported(why, hint="the write runs eagerly")
        e.break_at, e.break_location = site
        raise e


def graph_module(tr, outputs: list[TensorV]):
    guard_mutated_aliases(tr)
    if tr.new_leaves:
        _check_new_leaves(tr, outputs)
    g = tr.graph
    used = []
    for src, tv, real in tr.inputs:
        if tv.node.users or tv.node in [o.node for o in outputs]:
            used.append((src, tv, real))
        else:
            g.erase_node(tv.node)
    order = [u for u in used if u[0].structural] + [u for u in used if not u[0].structural]
    for src, tv, real in reversed(order):
        head = next(iter(g.nodes))
        if head is not tv.node:
            head.prepend(tv.node)
    out = g.output(tuple(o.node for o in outputs))
    out.meta["example_value"] = tuple(o.meta for o in outputs)
    g.lint()
    gm = fx.GraphModule(torch.nn.Module(), g, class_name="EmberGraph")
    gm.meta["ember_device"] = _device(tr)
    structural = [u[0] for u in order if u[0].structural]
    dynamic = [u[0] for u in order if not u[0].structural]
    examples = [u[2] for u in order]
    return gm, structural, dynamic, examples


def _device(tr):
    for _, tv, _ in tr.inputs:
        if isinstance(tv, TensorV):
            return tv.device
    return torch.get_default_device()
