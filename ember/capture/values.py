"""Capture, values: the small set of kinds the symbolic interpreter pushes on its stack.

  ObjV      a real Python object known at trace time (constants, classes, functions, modules,
            user objects); guarded through its `source` when it came from the caller
  NewModuleV  a torch.nn module made in the trace (a loss module, a Sequential slice)
  LazyV     a float or str from the caller, or a pure function of such values, guarded by value
            only when the trace uses it (see the class); also a nested function, whose
            identity is guarded only when used
  TensorV   a tensor: an FX node + a meta-device example value (+ the real device)
  NdarrayV  a NumPy array made from a tensor in the trace (x.numpy(), np.* on tensors): its
            data is a TensorV; NumPy calls on it are torch._numpy calls in the graph (ndarrays.py)
  ListV / TupleV / DictV   containers whose items are values (tensors inside stay symbolic)
  DictViewV a live keys/values/items view of a DictV
  FuncV     a function created during the trace (MAKE_FUNCTION: lambdas, comprehensions, closures)
  MethodV   a bound method (function value + self value)
  PartialV  a functools.partial made in the trace
  DecoratedV  a function decorated with a traced context manager (@torch.no_grad())
  CellV     a closure cell created during the trace
  IterV     an iterator over a materialized list of values
  GenV      a lazy iterator: a generator's suspended frame, or map/zip/... over one
  NewObjV   an object created during the trace (dataclass, ModelOutput, plain class instance)
  ContextV  a context manager the tracer understands (grad mode, autocast, nullcontext)
  SuperV    the result of super()
Every value has `source` (None when created during the trace).
"""
from __future__ import annotations

import torch


def is_model_output(cls) -> bool:
    """A transformers ModelOutput dataclass (matched by name: capture never imports it)."""
    return any(k.__name__ == "ModelOutput" and k.__module__.startswith("transformers")
               for k in cls.__mro__)


class V:
    __slots__ = ("source",)
    kind = "value"

    def python_type(self):
        raise NotImplementedError


class _Null:
    def __repr__(self):
        return "NULL"


NULL = _Null()


class ObjV(V):
    __slots__ = ("value",)
    kind = "obj"

    def __init__(self, value, source=None):
        self.value, self.source = value, source

    def python_type(self):
        return type(self.value)

    def __repr__(self):
        return f"ObjV({self.value!r:.60})"


class LazyV(ObjV):
    """A scalar the trace has not specialized on yet: a float or str read from the caller
    (typically a `loss.item()` handed to a resume function), or the result of a pure function of such values
    (`round(f, 2)`, `f"{f:.4f}"`, `f * 2`). Reading `.value` is a use: it first runs `force`,
    which installs the value guards. Never read, the value stays unguarded and the residual
    code recomputes it from its `source`, or as `fn(*args, **kwargs)`: a float that only reaches
    print/logging does not recompile the frame for each new value."""
    __slots__ = ("_value", "_force", "fn", "args", "kwargs")

    def __init__(self, value, force, source=None, fn=None, args=(), kwargs=None):
        self._value, self._force, self.source = value, force, source
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs or {})

    @property
    def value(self):
        if self._force is not None:
            force, self._force = self._force, None
            force()
        return self._value

    @property
    def pending(self) -> bool:
        return self._force is not None

    def python_type(self):
        return type(self._value)

    def __repr__(self):
        return f"LazyV({self._value!r:.60}{', pending' if self.pending else ''})"


class NewModuleV(ObjV):
    """A torch.nn module built during the trace: a stateless one from constant arguments, or a
    slice of a Sequential/ModuleList (whose submodules the trace reads through their own
    sources); residual code makes it again as `fn(*args, **kwargs)` (fn: `type(value)`, or
    `operator.getitem` for a slice)."""
    __slots__ = ("args", "kwargs", "fn")

    def __init__(self, value, args, kwargs, fn=None):
        super().__init__(value)
        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.fn = fn or type(value)


def peek(v: ObjV):
    """An ObjV's value without using it (a LazyV stays unguarded)."""
    return v._value if isinstance(v, LazyV) else v.value


def pending(v) -> bool:
    """Whether a value holds a LazyV the trace has not used (containers included)."""
    if isinstance(v, LazyV):
        return v.pending
    if isinstance(v, (ListV, TupleV)):
        return any(pending(i) for i in v.items)
    if isinstance(v, DictV):
        return any(pending(i) for i in v.items.values())
    return False


class TensorV(V):
    __slots__ = ("node", "meta", "device", "cls")
    kind = "tensor"

    def __init__(self, node, meta: torch.Tensor, device: torch.device, source=None, cls=torch.Tensor):
        self.node, self.meta, self.device, self.source, self.cls = node, meta, device, source, cls

    def python_type(self):
        return self.cls

    def __repr__(self):
        return f"TensorV({self.node.name}, {tuple(self.meta.shape)}, {self.meta.dtype})"


class NdarrayV(V):
    """A NumPy array whose data is the tensor value `t` (the same storage, as `x.numpy()`)."""
    __slots__ = ("t",)
    kind = "ndarray"

    def __init__(self, t: TensorV):
        self.t, self.source = t, None

    def python_type(self):
        import numpy
        return numpy.ndarray

    def __repr__(self):
        return f"NdarrayV({self.t!r})"


class ListV(V):
    __slots__ = ("items", "cls")
    kind = "list"

    def __init__(self, items, source=None, cls=list):
        self.items, self.source, self.cls = list(items), source, cls

    def python_type(self):
        return self.cls

    def __repr__(self):
        return f"ListV({self.items})"


class TupleV(V):
    __slots__ = ("items", "cls")
    kind = "tuple"

    def __init__(self, items, source=None, cls=tuple):
        self.items, self.source, self.cls = tuple(items), source, cls

    def python_type(self):
        return self.cls

    def __repr__(self):
        return f"TupleV({self.items})"


class DictV(V):
    """Keys are real hashable objects (dictkeys.py); values are values. `factory`: a
    defaultdict's default_factory value."""
    __slots__ = ("items", "cls", "factory")
    kind = "dict"

    def __init__(self, items: dict, source=None, cls=dict, factory=None):
        self.items, self.source, self.cls, self.factory = dict(items), source, cls, factory

    def python_type(self):
        return self.cls


class DictViewV(V):
    """`d.keys()` / `.values()` / `.items()` of a dict value: live, so it reads the dict's
    items when used, after any later change (as Python's views do)."""
    __slots__ = ("d", "view")
    kind = "dict_view"

    def __init__(self, d: DictV, view: str):
        self.d, self.view, self.source = d, view, None

    def python_type(self):
        return type(getattr({}, self.view)())

    def __repr__(self):
        return f"DictViewV({self.view})"


class FuncV(V):
    __slots__ = ("code", "globals", "name", "qualname", "defaults", "kwdefaults", "closure", "fn_obj")
    kind = "function"

    def __init__(self, code, globals_, name, qualname, defaults=(), kwdefaults=None, closure=()):
        self.code, self.globals, self.name, self.qualname = code, globals_, name, qualname
        self.defaults, self.kwdefaults, self.closure = tuple(defaults), dict(kwdefaults or {}), tuple(closure)
        self.source, self.fn_obj = None, None

    def python_type(self):
        import types
        return types.FunctionType


class PartialV(V):
    """`functools.partial(func, *args, **kwargs)` made in the trace."""
    __slots__ = ("func", "args", "kwargs")
    kind = "partial"

    def __init__(self, func: V, args, kwargs):
        self.func, self.args, self.kwargs, self.source = func, tuple(args), dict(kwargs), None

    def python_type(self):
        import functools
        return functools.partial


class DecoratedV(V):
    """`ctx(func)`: a function decorated with a context manager made in the trace
    (`@torch.no_grad()` on a nested function); each call runs `func` inside a fresh copy."""
    __slots__ = ("ctx", "func")
    kind = "decorated"

    def __init__(self, ctx, func: V):
        self.ctx, self.func, self.source = ctx, func, None

    def python_type(self):
        import types
        return types.FunctionType


class MethodV(V):
    __slots__ = ("func", "self_v")
    kind = "method"

    def __init__(self, func: V, self_v: V, source=None):
        self.func, self.self_v, self.source = func, self_v, source

    def python_type(self):
        import types
        return types.MethodType


class CellV(V):
    __slots__ = ("contents", "real")
    kind = "cell"

    def __init__(self, contents=None, real=None, source=None):
        self.contents, self.real, self.source = contents, real, source


class IterV(V):
    __slots__ = ("items", "pos")
    kind = "iterator"

    def __init__(self, items, source=None):
        self.items, self.pos, self.source = list(items), 0, source

    def python_type(self):
        return type(iter([]))


class _Stop:
    def __repr__(self):
        return "STOP"


STOP = _Stop()       # what stepping an exhausted iterator value gives


class GenV(V):
    """A lazy iterator made in the trace, stepped one value at a time (`for`, `next`, `yield
    from`) so that its code and its consumer's interleave as they do in Python: a generator
    (`frame` is its suspended frame, `ret` its return value once done) or a lazy builtin over
    one (`step(tracer) -> value | STOP`: map, filter, zip, enumerate)."""
    __slots__ = ("frame", "step", "started", "done", "ret", "cls")
    kind = "generator"

    def __init__(self, frame=None, step=None, cls=None):
        self.frame, self.step, self.started, self.done = frame, step, False, False
        self.ret, self.source = ObjV(None), None
        import types
        self.cls = cls or types.GeneratorType

    def python_type(self):
        return self.cls

    def __repr__(self):
        what = self.frame.code.co_qualname if self.frame is not None else self.cls.__name__
        return f"GenV({what}{', done' if self.done else ''})"


class NewObjV(V):
    """An object created during the trace. `fields` for dataclasses / ModelOutput (ordered)."""
    __slots__ = ("cls", "attrs", "dataclass")
    kind = "newobj"

    def __init__(self, cls, attrs: dict, dataclass: bool):
        self.cls, self.attrs, self.dataclass, self.source = cls, dict(attrs), dataclass, None

    def python_type(self):
        return self.cls


class ContextV(V):
    __slots__ = ("ctx_kind", "args", "state")
    kind = "context"

    def __init__(self, ctx_kind: str, args: tuple, state=None):
        self.ctx_kind, self.args, self.state, self.source = ctx_kind, args, state, None

    def python_type(self):
        return object


class SuperV(V):
    __slots__ = ("cls", "self_v")
    kind = "super"

    def __init__(self, cls, self_v):
        self.cls, self.self_v, self.source = cls, self_v, None

    def python_type(self):
        return super


class BuiltinMethodV(V):
    """A method of a container value (`lst.append`) or a tensor (`x.view`), bound to its receiver."""
    __slots__ = ("recv", "name")
    kind = "builtin_method"

    def __init__(self, recv: V, name: str):
        self.recv, self.name, self.source = recv, name, None

    def python_type(self):
        import types
        return types.BuiltinMethodType


def holds(vals, types) -> bool:
    """Is any of `vals`, or an item of a list, tuple or dict among them (nested), of `types`?"""
    for v in vals:
        if isinstance(v, types):
            return True
        if isinstance(v, (ListV, TupleV)) and holds(v.items, types):
            return True
        if isinstance(v, DictV) and holds(v.items.values(), types):
            return True
    return False


def is_const(v: V) -> bool:
    return isinstance(v, ObjV)


CONST_TYPES = (int, float, bool, str, type(None), complex, bytes, torch.dtype, torch.device,
               torch.memory_format, torch.layout, type(Ellipsis), type(NotImplemented))


SYM_TYPES = (torch.SymInt, torch.SymBool, torch.SymFloat)


def is_literal(x) -> bool:
    """A plain immutable constant that can be guarded by equality and printed with repr."""
    if type(x) in (tuple, frozenset, torch.Size):
        return all(is_literal(i) for i in x)
    if type(x) is slice:
        return is_literal(x.start) and is_literal(x.stop) and is_literal(x.step)
    return type(x) in CONST_TYPES
