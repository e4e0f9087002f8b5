"""Capture, builtins: `BUILTINS[fn] = handler(tracer, args, kwargs) -> value`, container methods,
iteration and truthiness of values.

Pure builtins on constants fold (run for real at trace time); on traced values they follow the
value's kind (len of a list value, isinstance of a tensor value, ...). Anything that needs a
tensor's data raises Unsupported.
"""
from __future__ import annotations

import builtins
import collections
import math
import operator
import types

import torch

from . import numbers
from .dictkeys import dict_key, has_traced_keys, key_value, missing, ordered_dict_method
from .scalar_args import REWRITES
from .values import (STOP, BuiltinMethodV, ContextV, DictV, DictViewV, FuncV, GenV, IterV,
                     LazyV, ListV, MethodV, NdarrayV, NewObjV, ObjV, SYM_TYPES, SuperV, TensorV,
                     TupleV, V, is_literal, is_model_output, peek, pending)

BUILTINS: dict = {}


def builtin(*fns):
    def deco(h):
        for f in fns:
            BUILTINS[f] = h
        return h
    return deco


def real(tr, v: V, use: bool = True):
    """The real Python value of a constant-like value (containers of constants included).
    `use=False` reads LazyVs without using them (no guard)."""
    if isinstance(v, ObjV):
        return v.value if use else peek(v)
    if isinstance(v, (ListV, TupleV)):
        items = [real(tr, i, use) for i in v.items]
        if isinstance(v, ListV):
            return items
        return v.cls(items) if v.cls in (tuple, torch.Size) else v.cls(*items)
    if isinstance(v, (DictV, DictViewV)) and has_traced_keys(v.items if isinstance(v, DictV)
                                                             else v.d.items):
        raise tr.unsupported("a dict keyed by a tensor of the trace used where a constant is needed")
    if isinstance(v, DictV):
        return {k: real(tr, x, use) for k, x in v.items.items()}
    if isinstance(v, DictViewV):       # keys are constants: a keys view is one whatever the values
        d = dict.fromkeys(v.d.items) if v.view == "keys" else real(tr, v.d, use)
        return getattr(d, v.view)()
    raise tr.unsupported(f"{type(v).__name__} used where a constant is needed")


def fold(tr, f, args, kwargs) -> V:
    """`f(*args, **kwargs)` for a pure `f` at trace time. Over an unused LazyV the result is a
    LazyV too (its value is only guarded once something uses it)."""
    vals = (*args, *kwargs.values())
    # only over plain values: a container could change before the residual code rebuilds it
    lazy = any(pending(a) for a in vals) and all(isinstance(a, ObjV) for a in vals)
    try:
        out = f(*[real(tr, a, not lazy) for a in args],
                **{k: real(tr, x, not lazy) for k, x in kwargs.items()})
    except Exception as e:  # noqa: BLE001 - the user's code raises here eagerly too
        from .interpreter import TracedRaise
        _use(tr, args, kwargs)
        raise TracedRaise(e) from None
    if lazy and is_literal(out):
        return LazyV(out, lambda: _use(tr, args, kwargs), fn=f, args=args, kwargs=kwargs)
    _use(tr, args, kwargs)
    return tr.const_value(out)


def _use(tr, args, kwargs):
    for a in (*args, *kwargs.values()):
        if pending(a):
            real(tr, a)         # reading is using: installs the guards


def pytype(v: V):
    if isinstance(v, ObjV):
        return type(peek(v))
    return v.python_type()


# ---- iteration and truth --------------------------------------------------------------------
MAX_ITEMS = 100_000         # a lazy iterator drained past this is taken to be endless


def step(tr, it: V):
    """The next value of an iterator value (IterV or GenV), or STOP."""
    if isinstance(it, IterV):
        if it.pos < len(it.items):
            it.pos += 1
            return it.items[it.pos - 1]
        return STOP
    if it.frame is not None:
        return tr.resume_generator(it)
    if it.done:
        return STOP
    v = it.step(tr)
    it.done = v is STOP
    return v


def view_items(tr, v: DictViewV) -> list:
    """A dict view's values now."""
    it = v.d.items
    if v.view == "keys":
        return [key_value(tr, k) for k in it]
    if v.view == "values":
        return list(it.values())
    return [TupleV([key_value(tr, k), x]) for k, x in it.items()]


def as_iter(tr, v: V) -> V:
    """`iter(v)` as a value: iterators stay themselves (lazy ones lazy)."""
    return v if isinstance(v, (IterV, GenV)) else IterV(iterate(tr, v))


def iterate(tr, v: V) -> list:
    if isinstance(v, (ListV, TupleV)):
        return list(v.items)
    if isinstance(v, DictV):
        return [key_value(tr, k) for k in v.items]
    if isinstance(v, DictViewV):
        return view_items(tr, v)
    if isinstance(v, IterV):
        out = v.items[v.pos:]
        v.pos = len(v.items)
        return out
    if isinstance(v, GenV):
        out = []
        while (x := step(tr, v)) is not STOP:
            out.append(x)
            if len(out) > MAX_ITEMS:
                raise tr.unsupported(f"an iterator drained past {MAX_ITEMS} values (endless?)")
        return out
    if isinstance(v, TensorV):
        if v.meta.dim() == 0:
            raise tr.unsupported("iteration over a 0-d tensor")
        return [tr.call_graph(operator.getitem, [v, ObjV(i)], {}) for i in range(v.meta.shape[0])]
    if isinstance(v, ObjV):
        x = v.value
        if type(x) is set and tr.set_members.get(id(x)):
            if len(x) + len(tr.set_members[id(x)]) == 1:       # one member: no order to know
                return [*(ObjV(i) for i in x), *tr.set_members[id(x)]]
            raise tr.unsupported("iterating a set that holds tensors (in id-hash order)")
        if isinstance(x, (range, str, bytes, tuple, list, frozenset, set, dict)) and \
                is_literal(tuple(x)) if isinstance(x, (set, frozenset, dict)) else \
                isinstance(x, (range, str, bytes)):
            return [ObjV(i) for i in x]
        if isinstance(x, (tuple, list)) and all(is_literal(i) or i is None for i in x):
            return [ObjV(i) for i in x]
        if isinstance(x, (dict, set, frozenset)) and all(is_literal(i) for i in x):
            return [ObjV(i) for i in x]
        it = getattr(type(x), "__iter__", None)
        if isinstance(it, types.FunctionType):
            return iterate(tr, tr.call(ObjV(it), [v], {}))
        if type(x).__name__ in ("dict_keys", "dict_values", "dict_items", "odict_keys",
                                  "odict_values", "odict_items"):
            return [tr.const_value(i) for i in x]
        if isinstance(x, torch.Size):
            return [ObjV(i) for i in x]
        if type(x) is tuple:            # of objects (a class's __mro__): read item by item
            return [tr.wrap(i, tr.item_source(v.source, k, frozen=True)) if v.source is not None
                    else tr.const_value(i) for k, i in enumerate(x)]
    if isinstance(v, NewObjV):
        it = getattr(v.cls, "__iter__", None)
        if v.dataclass and is_model_output(v.cls):
            return [ObjV(k) for k, x in v.attrs.items() if not _is_none(x)]
        if isinstance(it, types.FunctionType):
            return iterate(tr, tr.call(ObjV(it), [v], {}))
    raise tr.unsupported(f"iteration over {_describe(v)}")


def _describe(v):
    if isinstance(v, ObjV):
        return f"{type(v.value).__qualname__} object"
    return type(v).__name__


def _is_none(v):
    return isinstance(v, ObjV) and v.value is None


def truth(tr, v: V) -> bool:
    if isinstance(v, ObjV):
        x = v.value
        t = type(x)
        if t is set and tr.set_members.get(id(x)):
            return True
        if is_literal(x) or t in (list, dict, set, range, types.FunctionType, type) or x is None \
                or isinstance(x, SYM_TYPES):
            return bool(x)          # a SymBool: guarded by the shape env
        b = getattr(t, "__bool__", None) or getattr(t, "__len__", None)
        if b is None:
            return True
        if isinstance(b, types.FunctionType):
            r = tr.call(ObjV(b), [v], {})
            return truth(tr, r)
        if isinstance(x, torch.nn.Module):
            return bool(x)
        return bool(x)
    if isinstance(v, (ListV, TupleV, DictV)):
        return bool(v.items)
    if isinstance(v, DictViewV):
        return bool(v.d.items)
    if isinstance(v, TensorV) and (x := numbers.value_of(tr, v, "__bool__")) is not None:
        return x
    if isinstance(v, (TensorV, NdarrayV)):
        raise tr.unsupported("branching on a tensor value (data-dependent control flow)",
                             hint="use torch.where, or compute the condition outside")
    if isinstance(v, NewObjV):
        b = getattr(v.cls, "__bool__", None) or getattr(v.cls, "__len__", None)
        if v.dataclass and is_model_output(v.cls):
            return any(not _is_none(x) for x in v.attrs.values())
        if isinstance(b, types.FunctionType):
            return truth(tr, tr.call(ObjV(b), [v], {}))
        return True
    return True


# ---- builtin functions ----------------------------------------------------------------------
@builtin(len)
def _len(tr, args, kwargs):
    (v,) = args
    if isinstance(v, (ListV, TupleV, DictV)):
        return ObjV(len(v.items))
    if isinstance(v, DictViewV):
        return ObjV(len(v.d.items))
    if isinstance(v, TensorV):
        if v.meta.dim() == 0:
            raise tr.unsupported("len() of a 0-d tensor")
        return ObjV(v.meta.shape[0])
    if isinstance(v, NdarrayV):
        return _len(tr, [v.t], {})
    if isinstance(v, ObjV):
        x = v.value
        f = getattr(type(x), "__len__", None)
        if isinstance(f, types.FunctionType):
            return tr.call(ObjV(f), [v], {})
        return ObjV(len(x) + len(tr.set_members.get(id(x), ())))
    if isinstance(v, NewObjV):
        if v.dataclass and is_model_output(v.cls):
            return ObjV(sum(not _is_none(x) for x in v.attrs.values()))
        f = getattr(v.cls, "__len__", None)
        if isinstance(f, types.FunctionType):
            return tr.call(ObjV(f), [v], {})
    raise tr.unsupported(f"len() of {_describe(v)}")


@builtin(isinstance)
def _isinstance(tr, args, kwargs):
    v, cls = args
    c = real(tr, cls)
    if isinstance(v, ObjV):
        return ObjV(isinstance(v.value, c))
    t = pytype(v)
    if isinstance(v, TensorV) and t is torch.Tensor and c is torch.nn.Parameter:
        return ObjV(False)
    return ObjV(issubclass(t, c))


@builtin(issubclass, callable, repr, hash, ord, chr, divmod, pow, round, abs, format,
         math.sqrt, math.ceil, math.floor, math.log, math.exp, math.log2, math.log10, math.pi.__class__,
         math.prod, math.isfinite, math.isnan, math.isinf, math.gcd, math.pow, math.sin, math.cos,
         operator.index)
def _pure(tr, args, kwargs, _f=None):
    raise AssertionError  # replaced below per function


def _make_pure(f):
    def h(tr, args, kwargs):
        if isinstance(f, type(abs)) and f in (abs, round, pow) and args and isinstance(args[0], TensorV):
            return tr.call_graph({abs: torch.abs, round: torch.round, pow: torch.pow}[f], args, kwargs)
        if f is callable and args and not isinstance(args[0], ObjV):
            from .values import PartialV
            return ObjV(isinstance(args[0], (FuncV, MethodV, BuiltinMethodV, PartialV)) or
                        isinstance(args[0], NewObjV) and hasattr(args[0].cls, "__call__"))
        return fold(tr, f, args, kwargs)
    return h


for _f in list(BUILTINS):
    if BUILTINS[_f] is _pure:
        BUILTINS[_f] = _make_pure(_f)
del BUILTINS[math.pi.__class__]


@builtin(type)
def _type(tr, args, kwargs):
    if len(args) != 1:
        raise tr.unsupported("type() with 3 arguments")
    v = args[0]
    return ObjV(pytype(v))


@builtin(getattr)
def _getattr(tr, args, kwargs):
    from .attrs import TraceAttributeError, load_attr
    obj, name = args[0], real(tr, args[1])
    try:
        return load_attr(tr, obj, name)
    except TraceAttributeError:
        if len(args) == 3:
            return args[2]
        raise tr.unsupported(f"{_describe(obj)} has no attribute {name!r}",
                             hint="the same access raises AttributeError eagerly")


def _setattr(tr, args, kwargs):
    """`setattr(obj, name, value)` on a value the caller holds (a module: nn.utils.weight_norm's
    hook sets its weight so), a new object or a tensor: `obj.name = value` (STORE_ATTR),
    replayed after the graph. On an object the trace made from constants (a deep copy), None:
    folded like any builtin on constants."""
    from .attrs import store_attr
    obj = args[0] if len(args) == 3 and not kwargs else None
    if not isinstance(obj, (NewObjV, TensorV)) and not (
            isinstance(obj, ObjV) and obj.source is not None and not isinstance(obj.value, type)):
        return None
    store_attr(tr, obj, real(tr, args[1]), args[2])
    return ObjV(None)


REWRITES[setattr] = _setattr


@builtin(object.__setattr__)
def _object_setattr(tr, args, kwargs):
    """`object.__setattr__(obj, name, value)` (a user __setattr__'s super() call, frozen
    dataclasses): the plain store, without the class's own __setattr__."""
    from .attrs import store_attr
    if len(args) != 3 or kwargs:
        raise tr.unsupported("object.__setattr__ with unexpected arguments")
    store_attr(tr, args[0], real(tr, args[1]), args[2], plain=True)
    return ObjV(None)


@builtin(hasattr)
def _hasattr(tr, args, kwargs):
    from .attrs import TraceAttributeError, load_attr
    try:
        load_attr(tr, args[0], real(tr, args[1]))
        return ObjV(True)
    except TraceAttributeError:
        return ObjV(False)


@builtin(int, float, bool, str, complex)
def _scalar(tr, args, kwargs):
    raise AssertionError


def _make_scalar(t):
    def h(tr, args, kwargs):
        if not args:
            return ObjV(t())
        v = args[0]
        if isinstance(v, TensorV) and t in (int, float, bool) and \
                (x := numbers.value_of(tr, v, f"__{t.__name__}__")) is not None:
            return ObjV(x)                  # a tensor made from numbers (numbers.py)
        if isinstance(v, TensorV):
            raise tr.unsupported(f"{t.__name__}() of a tensor needs its data (data-dependent)",
                                 hint="keep the value as a tensor")
        if t is bool:
            return ObjV(truth(tr, v))
        if t is str and not isinstance(v, ObjV):
            raise tr.unsupported(f"str() of {_describe(v)}")
        return fold(tr, t, args, kwargs)
    return h


for _t in (int, float, bool, str, complex):
    BUILTINS[_t] = _make_scalar(_t)


@builtin(tuple, list)
def _seq(tr, args, kwargs):
    raise AssertionError


def _make_seq(t):
    def h(tr, args, kwargs):
        items = iterate(tr, args[0]) if args else []
        return ListV(items) if t is list else TupleV(items)
    return h


BUILTINS[tuple] = _make_seq(tuple)
BUILTINS[list] = _make_seq(list)


@builtin(dict)
def _dict(tr, args, kwargs):
    items = {}
    if args:
        a = args[0]
        if isinstance(a, DictV):
            items.update(a.items)
        elif isinstance(a, (NewObjV, ObjV)) and hasattr(pytype(a), "keys"):
            # a mapping: dict() reads its keys() and then each item, as CPython does
            from .attrs import load_attr
            for k in iterate(tr, tr.call(load_attr(tr, a, "keys"), [], {})):
                items[dict_key(tr, k)] = tr.getitem(a, k)
        else:
            for pair in iterate(tr, a):
                k, x = iterate(tr, pair)
                items[dict_key(tr, k)] = x
    items.update(kwargs)
    return DictV(items)


def _make_fromkeys(cls):
    def h(tr, args, kwargs):
        """`cls.fromkeys(keys, value=None)`: keys are constants, every key holds `value`."""
        if not args or len(args) + len(kwargs) > 2 or set(kwargs) - {"value"}:
            raise tr.unsupported(f"{cls.__name__}.fromkeys with unexpected arguments")
        value = args[1] if len(args) > 1 else kwargs.get("value", ObjV(None))
        d = DictV({dict_key(tr, k): value for k in iterate(tr, args[0])})
        d.cls = cls
        return d
    return h


for _cls in (dict, collections.OrderedDict, collections.defaultdict):
    BUILTINS[_cls.fromkeys] = _make_fromkeys(_cls)


def _tuple_new(tr, args, kwargs):
    """`tuple.__new__(cls, iterable)`: a namedtuple's `_make` and `__new__`."""
    cls = real(tr, args[0])
    if not (isinstance(cls, type) and issubclass(cls, tuple)) or len(args) > 2 or kwargs:
        raise tr.unsupported("tuple.__new__ with these arguments")
    items = iterate(tr, args[1]) if len(args) > 1 else []
    if hasattr(cls, "_fields") and len(items) != len(cls._fields):
        from .interpreter import TracedRaise
        raise TracedRaise(TypeError(f"Expected {len(cls._fields)} arguments, got {len(items)}"))
    return TupleV(items, cls=cls)


BUILTINS[tuple.__new__] = _tuple_new


@builtin(range, slice)
def _range(tr, args, kwargs):
    raise AssertionError


def _index(tr, v):
    """An int argument: a tensor made from numbers reads as its value (numbers.py)."""
    x = numbers.value_of(tr, v, "__index__")
    return v if x is None else ObjV(x)


BUILTINS[range] = lambda tr, a, k: fold(tr, range, [_index(tr, x) for x in a], k)
BUILTINS[slice] = lambda tr, a, k: ObjV(slice(*[real(tr, x) for x in a])) if all(
    isinstance(x, ObjV) for x in a) else _bad(tr, "slice() with traced bounds")


def _bad(tr, msg):
    raise tr.unsupported(msg)


@builtin(iter)
def _iter(tr, args, kwargs):
    if len(args) != 1:
        raise tr.unsupported("iter() with a sentinel")
    return as_iter(tr, args[0])


@builtin(next)
def _next(tr, args, kwargs):
    it = args[0]
    if not isinstance(it, (IterV, GenV)):
        raise tr.unsupported(f"next() of {_describe(it)}", hint="fails eagerly unless it is an "
                             "iterator")
    x = step(tr, it)
    if x is not STOP:
        return x
    if len(args) > 1:
        return args[1]
    from .interpreter import TracedRaise
    raise TracedRaise(StopIteration())


def _lazy(args) -> bool:
    return any(isinstance(a, GenV) for a in args)


@builtin(enumerate)
def _enumerate(tr, args, kwargs):
    start = real(tr, args[1]) if len(args) > 1 else real(tr, kwargs.get("start", ObjV(0)))
    if _lazy(args[:1]):
        src, n = args[0], [start]

        def next_pair(tr):
            x = step(tr, src)
            if x is STOP:
                return STOP
            n[0] += 1
            return TupleV([ObjV(n[0] - 1), x])
        return GenV(step=next_pair, cls=enumerate)
    return IterV([TupleV([ObjV(i + start), x]) for i, x in enumerate(iterate(tr, args[0]))])


@builtin(zip)
def _zip(tr, args, kwargs):
    """zip; with strict=True, the ValueError eager raises (at the step that finds one argument
    exhausted before the others)."""
    from .interpreter import TracedRaise
    strict = kwargs.get("strict") is not None and bool(real(tr, kwargs["strict"]))

    def unequal(i, side):
        first = f"arguments 1-{i}" if i > 1 else "argument 1"
        return TracedRaise(ValueError(f"zip() argument {i + 1} is {side} than {first}"))
    if _lazy(args) or strict:
        its = [as_iter(tr, a) for a in args]

        def next_tuple(tr):
            out = []
            for i, it in enumerate(its):     # as zip does: stops at the first exhausted one
                x = step(tr, it)
                if x is STOP:
                    if strict and i:
                        raise unequal(i, "shorter")
                    if strict:
                        for j, rest in enumerate(its[1:], 1):
                            if step(tr, rest) is not STOP:
                                raise unequal(j, "longer")
                    return STOP
                out.append(x)
            return TupleV(out)
        return GenV(step=next_tuple, cls=zip)
    lists = [iterate(tr, a) for a in args]
    return IterV([TupleV(t) for t in zip(*lists)])


@builtin(reversed)
def _reversed(tr, args, kwargs):
    return IterV(list(reversed(iterate(tr, args[0]))))


@builtin(map)
def _map(tr, args, kwargs):
    fn = args[0]
    if _lazy(args[1:]):
        pairs = _zip(tr, args[1:], {})

        def next_value(tr):
            t = step(tr, pairs)
            return STOP if t is STOP else tr.call(fn, list(t.items), {})
        return GenV(step=next_value, cls=map)
    lists = [iterate(tr, a) for a in args[1:]]
    return IterV([tr.call(fn, list(t), {}) for t in zip(*lists)])


def _keeps(tr, fn, x) -> bool:
    return truth(tr, x) if isinstance(fn, ObjV) and fn.value is None else \
        truth(tr, tr.call(fn, [x], {}))


@builtin(filter)
def _filter(tr, args, kwargs):
    fn = args[0]
    if _lazy(args[1:]):
        src = args[1]

        def next_kept(tr):
            while (x := step(tr, src)) is not STOP:
                if _keeps(tr, fn, x):
                    return x
            return STOP
        return GenV(step=next_kept, cls=filter)
    items = iterate(tr, args[1])
    keep = []
    for i in items:
        ok = truth(tr, i) if isinstance(fn, ObjV) and fn.value is None else truth(tr, tr.call(fn, [i], {}))
        if ok:
            keep.append(i)
    return IterV(keep)


@builtin(super)
def _super(tr, args, kwargs):
    if args:
        return SuperV(real(tr, args[0]), args[1])
    f = tr.frames[-1]
    cell = f.cells.get("__class__")
    if cell is None or not f.code.co_varnames:
        raise tr.unsupported("super() without a __class__ cell")
    cls = tr.cell_get(cell)
    return SuperV(real(tr, cls), f.locals[f.code.co_varnames[0]])


@builtin(print)
def _print(tr, args, kwargs):
    raise tr.unsupported("print() inside the compiled region", hint="it runs eagerly at a graph "
                         "break, between two graphs; fullgraph=True refuses it")


@builtin(id)
def _id(tr, args, kwargs):
    if isinstance(args[0], ObjV):
        return ObjV(id(args[0].value))
    raise tr.unsupported("id() of a traced value")


for _name, _op in vars(operator).items():
    if callable(_op) and not _name.startswith("_") and _op not in BUILTINS and _name not in (
            "index", "attrgetter", "itemgetter", "methodcaller", "length_hint", "call"):
        BUILTINS[_op] = (lambda o: lambda tr, a, k: tr.binary(o, *a) if len(a) == 2 else
                         tr.unary(o, a[0]))(_op)


# ---- container methods ----------------------------------------------------------------------
def container_method(tr, recv: V, name: str, args, kwargs) -> V:
    if isinstance(recv, ListV):
        if recv.cls is collections.deque:
            from .stdlib import deque_method
            out = deque_method(tr, recv, name, args, kwargs)
            if out is not None:
                return out
        return _list_method(tr, recv, name, args)
    if isinstance(recv, TupleV):
        if name in ("index", "count"):
            return fold(tr, getattr(tuple, name), [recv] + list(args), {})
        if name == "_asdict":
            return DictV(dict(zip(recv.cls._fields, recv.items)))
        if name == "_replace":
            items = list(recv.items)
            for k, x in kwargs.items():
                items[recv.cls._fields.index(k)] = x
            return TupleV(items, cls=recv.cls)
    if isinstance(recv, DictV):
        return _dict_method(tr, recv, name, args, kwargs)
    if isinstance(recv, NewObjV) and recv.dataclass and is_model_output(recv.cls):
        if name in _MODEL_OUTPUT_READS:
            # the mapping a ModelOutput keeps: its non-None fields in order (a view of a
            # snapshot: a later write to the ModelOutput is not seen through a view taken
            # before it)
            items = {k: x for k, x in recv.attrs.items() if not _is_none(x)}
            return _dict_method(tr, DictV(items, cls=dict), name, args, kwargs)
        if name == "__setitem__" and len(args) == 2:      # super().__setitem__ in __setattr__
            from .handlers.ops import setitem
            setitem(tr, recv, *args)
            return ObjV(None)
    raise tr.unsupported(f"method {name!r} of {_describe(recv)}")


_MODEL_OUTPUT_READS = ("keys", "values", "items", "get")


def _mutate(tr, v: V):
    tr.writes += 1
    if v.source is not None and id(v) not in tr.fresh and not any(m is v for m in tr.mutated):
        tr.mutated.append(v)


def _list_method(tr, lst: ListV, name, args):
    it = lst.items
    if name == "append":
        _mutate(tr, lst)
        it.append(args[0])
        return ObjV(None)
    if name == "extend":
        _mutate(tr, lst)
        it.extend(iterate(tr, args[0]))
        return ObjV(None)
    if name == "insert":
        _mutate(tr, lst)
        it.insert(real(tr, args[0]), args[1])
        return ObjV(None)
    if name == "pop":
        _mutate(tr, lst)
        return it.pop(real(tr, args[0]) if args else -1)
    if name == "clear":
        _mutate(tr, lst)
        it.clear()
        return ObjV(None)
    if name == "reverse":
        _mutate(tr, lst)
        it.reverse()
        return ObjV(None)
    if name == "copy":
        return ListV(list(it))
    if name in ("index", "count", "__contains__") and all(isinstance(i, ObjV) for i in it):
        return fold(tr, getattr(list, name), [lst] + list(args), {})
    if name == "remove" and all(isinstance(i, ObjV) for i in it):
        _mutate(tr, lst)
        vals = [i.value for i in it]
        del it[vals.index(real(tr, args[0]))]
        return ObjV(None)
    if name == "sort" and all(isinstance(i, ObjV) for i in it):
        _mutate(tr, lst)
        it.sort(key=lambda v: v.value)
        return ObjV(None)
    raise tr.unsupported(f"list.{name} on traced values")


def _dict_method(tr, d: DictV, name, args, kwargs):
    it = d.items
    if name in ("get", "__getitem__"):
        k = dict_key(tr, args[0])
        if k in it:
            return it[k]
        if name == "__getitem__" and (x := missing(tr, d, k)) is not None:
            return x
        if name == "get":
            return args[1] if len(args) > 1 else ObjV(None)
        raise tr.unsupported(f"KeyError {k!r}")
    if name in ("keys", "values", "items"):
        return DictViewV(d, name)
    if name == "__contains__":
        return ObjV(dict_key(tr, args[0]) in it)
    if name in ("__setitem__",):
        _mutate(tr, d)
        it[dict_key(tr, args[0])] = args[1]
        return ObjV(None)
    if name == "pop":
        _mutate(tr, d)
        k = dict_key(tr, args[0])
        if k in it:
            return it.pop(k)
        if len(args) > 1:
            return args[1]
        raise tr.unsupported(f"KeyError {k!r}")
    if name == "setdefault":
        k = dict_key(tr, args[0])
        if k not in it:
            _mutate(tr, d)
            it[k] = args[1] if len(args) > 1 else ObjV(None)
        return it[k]
    if name == "update":
        _mutate(tr, d)
        if args:
            src = args[0]
            if isinstance(src, DictV):
                it.update(src.items)
            else:
                for pair in iterate(tr, src):
                    k, x = iterate(tr, pair)
                    it[dict_key(tr, k)] = x
        it.update(kwargs)
        return ObjV(None)
    if name == "copy":
        return DictV(dict(it), cls=d.cls, factory=d.factory)
    if name == "clear":
        _mutate(tr, d)
        it.clear()
        return ObjV(None)
    if name in ("popitem", "move_to_end") and len(args) + len(kwargs) <= 2:
        return ordered_dict_method(tr, d, name, args, kwargs)
    raise tr.unsupported(f"dict.{name} on traced values")


__all__ = ["BUILTINS", "fold", "iterate", "truth", "real", "builtins", "ContextV"]


def _real_callable(tr, v):
    if isinstance(v, ObjV):
        return v.value
    if isinstance(v, MethodV) and isinstance(v.func, ObjV) and isinstance(v.self_v, ObjV):
        return types.MethodType(v.func.value, v.self_v.value)
    if isinstance(v, FuncV):
        import types as _t
        return _t.FunctionType(v.code, v.globals, v.name)
    raise tr.unsupported(f"inspecting a {type(v).__name__}")


def _signature(tr, args, kwargs):
    import inspect
    return ObjV(inspect.signature(_real_callable(tr, args[0])))


import inspect as _inspect  # noqa: E402

BUILTINS[_inspect.signature] = _signature
BUILTINS[_inspect.isfunction] = lambda tr, a, k: ObjV(isinstance(a[0], FuncV) or isinstance(
    a[0], ObjV) and _inspect.isfunction(a[0].value))
BUILTINS[_inspect.ismethod] = lambda tr, a, k: ObjV(isinstance(a[0], MethodV) or isinstance(
    a[0], ObjV) and _inspect.ismethod(a[0].value))
BUILTINS[_inspect.isclass] = lambda tr, a, k: ObjV(isinstance(a[0], ObjV) and isinstance(a[0].value, type))
