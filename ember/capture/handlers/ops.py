"""Handlers: unary/binary operators, comparisons, identity, membership, subscripts, slices.

Tensor operands go into the graph as `operator.*` calls; constants fold; containers follow
Python's semantics on their item values; user objects' dunder methods are inlined.
"""
from __future__ import annotations

import collections
import operator
import types

from .. import ndarrays, numbers
from ..flex import index_scalar
from ..dictkeys import dict_key, missing
from ..values import (NULL, SYM_TYPES, DictV, DictViewV, ListV, NdarrayV, NewObjV, ObjV, TensorV,
                      TupleV,
                      is_literal, is_model_output, peek)
from . import handler

BINARY_OPS = [operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul,
              operator.mul, operator.mod, operator.or_, operator.pow, operator.rshift,
              operator.sub, operator.truediv, operator.xor,
              operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
              operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift,
              operator.isub, operator.itruediv, operator.ixor]
_INPLACE_TO_PLAIN = {BINARY_OPS[13 + i]: BINARY_OPS[i] for i in range(13)}
_DUNDER = {operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
           operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
           operator.matmul: ("__matmul__", "__rmatmul__"), operator.eq: ("__eq__", "__eq__"),
           operator.ne: ("__ne__", "__ne__")}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
           ">": operator.gt, ">=": operator.ge}


def _const_like(v):
    if isinstance(v, ObjV):
        return True
    if isinstance(v, (ListV, TupleV)):
        return all(_const_like(i) for i in v.items)
    return False


def binary(tr, op, a, b):
    from ..builtins import real
    if isinstance(a, NdarrayV) or isinstance(b, NdarrayV):
        return ndarrays.binary(tr, op, a, b)
    if isinstance(a, TensorV) or isinstance(b, TensorV):
        if not isinstance(a, TensorV) and op in _INPLACE_TO_PLAIN:
            op = _INPLACE_TO_PLAIN[op]      # `n += tensor` with a number n is `n = n + tensor`
        if isinstance(a, (ListV, TupleV)) or isinstance(b, (ListV, TupleV)):
            if op in (operator.eq, operator.ne):
                return ObjV(op is operator.ne)
        return tr.call_graph(op, [a, b], {})
    if isinstance(a, ObjV) and isinstance(b, ObjV):
        if op in _INPLACE_TO_PLAIN and type(peek(a)) is set:
            from ..builtins import fold
            from ..stdlib import writable_set
            s = writable_set(tr, a)           # `s |= t` writes the set in place
            fold(tr, op, [ObjV(s), b], {})
            return a
        fa = _py_dunder(peek(a), op, 0)
        if fa is not None:
            return tr.call(ObjV(fa), [a, b], {})
        from ..builtins import fold
        return fold(tr, op, [a, b], {})
    if isinstance(a, DictViewV) or isinstance(b, DictViewV):
        # set operations and comparisons of views: on their values now (keys are constants)
        a, b = (ObjV(real(tr, x)) if isinstance(x, DictViewV) else x for x in (a, b))
        return binary(tr, op, a, b)
    if (isinstance(a, DictV) or isinstance(b, DictV)) and op in (operator.or_, operator.ior):
        return _dict_union(tr, op, a, b)
    plain = _INPLACE_TO_PLAIN.get(op, op)
    a, b = _as_seq(a, b), _as_seq(b, a)
    if isinstance(a, ListV) and op is operator.iadd:
        from ..builtins import _mutate, iterate
        _mutate(tr, a)
        a.items.extend(iterate(tr, b))
        return a
    if isinstance(a, (ListV, TupleV)) and isinstance(b, (ListV, TupleV)) and plain is operator.add:
        if type(a) is not type(b):
            raise tr.unsupported("adding a list and a tuple", hint="fails eagerly")
        return type(a)(list(a.items) + list(b.items))
    if isinstance(b, (ListV, TupleV)) and isinstance(a, ObjV) and plain is operator.mul:
        a, b = b, a                                 # 4 * [x]
    if isinstance(a, ListV) and isinstance(b, ObjV) and op is operator.imul:
        from ..builtins import _mutate
        _mutate(tr, a)                              # `l *= n` repeats the list in place
        a.items[:] = a.items * b.value
        return a
    if isinstance(a, (ListV, TupleV)) and isinstance(b, ObjV) and plain is operator.mul:
        return type(a)(list(a.items) * b.value)
    if op in (operator.eq, operator.ne) and _const_like(a) and _const_like(b):
        return ObjV(op(real(tr, a), real(tr, b)))
    if op in (operator.lt, operator.le, operator.gt, operator.ge) and _const_like(a) and _const_like(b):
        return ObjV(op(real(tr, a), real(tr, b)))
    if op in (operator.eq, operator.ne):
        for v, other, idx in ((a, b, 0), (b, a, 1)):
            if isinstance(v, NewObjV):
                d = getattr(v.cls, "__eq__", None)
                if isinstance(d, types.FunctionType):
                    r = tr.call(ObjV(d), [v, other], {})
                    return r if op is operator.eq else ObjV(not tr.truth(r))
        return ObjV((a is b) == (op is operator.eq))
    for v, other, idx in ((a, b, 0), (b, a, 1)):
        cls = v.cls if isinstance(v, NewObjV) else None
        if cls is not None and op in _DUNDER:
            d = getattr(cls, _DUNDER[op][idx], None)
            if isinstance(d, types.FunctionType):
                return tr.call(ObjV(d), [v, other], {})
    raise tr.unsupported(f"operator {op.__name__} on {type(a).__name__} and {type(b).__name__}")


_MERGEABLE = (dict, collections.OrderedDict, collections.defaultdict)


def _dict_union(tr, op, a, b):
    """`d | e` (a new dict of d's class) and `d |= e` (d updated in place), on item values;
    a constant dict operand is read as its items. transformers merges kwargs this way."""
    from ..builtins import _dict_method

    def as_dict(v):
        if isinstance(v, ObjV) and type(v.value) in _MERGEABLE and all(
                is_literal(x) for x in v.value.values()):
            return DictV({k: ObjV(x) for k, x in v.value.items()}, cls=type(v.value))
        return v
    if op is operator.ior:
        if not (isinstance(a, DictV) and a.cls in _MERGEABLE):
            raise tr.unsupported(f"operator ior on {type(a).__name__} and a dict")
        _dict_method(tr, a, "update", [as_dict(b)], {})    # any mapping or pairs, as eagerly
        return a
    a, b = as_dict(a), as_dict(b)
    if not (isinstance(a, DictV) and a.cls in _MERGEABLE):
        raise tr.unsupported(f"operator or_ on {type(a).__name__} and a dict", hint="fails eagerly")
    if not (isinstance(b, DictV) and b.cls in _MERGEABLE):
        raise tr.unsupported(f"operator or_ on a dict and {type(b).__name__}",
                             hint="fails eagerly")
    return DictV({**a.items, **b.items}, cls=a.cls, factory=a.factory)


def _as_seq(v, other):
    """A constant tuple/list next to a traced one becomes a container value."""
    if isinstance(v, ObjV) and isinstance(other, (ListV, TupleV)) and type(v.value) in (
            tuple, list, __import__("torch").Size):
        items = [ObjV(i) for i in v.value]
        return ListV(items) if type(v.value) is list else TupleV(items)
    return v


def _py_dunder(x, op, idx):
    if op not in _DUNDER:
        return None
    if isinstance(x, SYM_TYPES):
        return None                 # sizes fold on their SymNode, not by inlining torch's dunders
    d = getattr(type(x), _DUNDER[op][idx], None)
    return d if isinstance(d, types.FunctionType) else None


def unary(tr, op, a):
    if isinstance(a, NdarrayV):
        return ndarrays.unary(tr, op, a)
    if isinstance(a, TensorV):
        if op is operator.not_:
            raise tr.unsupported("`not tensor` needs the tensor's data (data-dependent)")
        return tr.call_graph(op, [a], {})
    if op is operator.not_:
        return ObjV(not tr.truth(a))
    if isinstance(a, ObjV):
        from ..builtins import fold
        return fold(tr, op, [a], {})
    raise tr.unsupported(f"operator {op.__name__} on {type(a).__name__}")


@handler("BINARY_OP")
def binary_op(tr, f, ins):
    b, a = f.pop(), f.pop()
    f.push(binary(tr, BINARY_OPS[ins.arg], a, b))


@handler("COMPARE_OP")
def compare_op(tr, f, ins):
    b, a = f.pop(), f.pop()
    op = ins.argval if isinstance(ins.argval, str) else str(ins.argval)
    f.push(binary(tr, COMPARE[op.replace("bool(", "").rstrip(")")], a, b))


@handler("UNARY_NEGATIVE")
def unary_negative(tr, f, ins):
    f.push(unary(tr, operator.neg, f.pop()))


@handler("UNARY_POSITIVE", until=(3, 12))
def unary_positive(tr, f, ins):
    f.push(unary(tr, operator.pos, f.pop()))


@handler("UNARY_NOT")
def unary_not(tr, f, ins):
    f.push(unary(tr, operator.not_, f.pop()))


@handler("UNARY_INVERT")
def unary_invert(tr, f, ins):
    f.push(unary(tr, operator.invert, f.pop()))


def is_same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, ObjV) and isinstance(b, ObjV):
        return a.value is b.value
    return False


@handler("IS_OP")
def is_op(tr, f, ins):
    b, a = f.pop(), f.pop()
    r = is_same(a, b)
    f.push(ObjV(r != bool(ins.arg)))


def contains(tr, item, container) -> bool:
    from ..builtins import real, view_items
    if isinstance(container, DictV):
        return dict_key(tr, item) in container.items
    if isinstance(container, DictViewV):
        if container.view == "keys":
            return dict_key(tr, item) in container.d.items
        container = ListV(view_items(tr, container))
    if isinstance(container, (ListV, TupleV)):
        for x in container.items:
            if x is item or is_same(x, item):
                return True
            if isinstance(x, ObjV) and isinstance(item, ObjV) and x.value == item.value:
                return True
            if isinstance(x, TensorV) or isinstance(item, TensorV):
                if not (isinstance(x, ObjV) or isinstance(item, ObjV)):
                    raise tr.unsupported("`in` over tensors compares their data")
        return False
    if isinstance(container, ObjV) and type(container.value) is set and \
            id(container.value) in tr.owned:
        if not isinstance(item, ObjV):        # kept by identity (set.add of a value)
            return any(m is item for m in tr.set_members.get(id(container.value), ()))
        return item.value in container.value
    if isinstance(container, ObjV) and isinstance(item, ObjV):
        c = container.value
        m = getattr(type(c), "__contains__", None)
        if isinstance(m, types.FunctionType):
            return tr.truth(tr.call(ObjV(m), [container, item], {}))
        return item.value in c
    if isinstance(container, NewObjV) and container.dataclass:
        x = container.attrs.get(real(tr, item), NULL)
        # a ModelOutput's mapping holds only its non-None fields
        return x is not NULL and not (is_model_output(container.cls) and isinstance(x, ObjV)
                                      and x.value is None)
    raise tr.unsupported(f"`in` on {type(container).__name__}")


@handler("CONTAINS_OP")
def contains_op(tr, f, ins):
    container, item = f.pop(), f.pop()
    f.push(ObjV(contains(tr, item, container) != bool(ins.arg)))


def getitem(tr, c, k):
    from ..builtins import real
    if isinstance(c, TensorV):
        if getattr(tr, "flex_mods", 0):            # inside a flex_attention score/mask mod
            out = index_scalar(tr, c, k)
            if out is not None:
                return out
        return tr.call_graph(operator.getitem, [c, k], {})
    if isinstance(c, NdarrayV):
        return ndarrays.getitem(tr, c, k)
    if isinstance(c, (ListV, TupleV)):
        if isinstance(k, TensorV):
            raise tr.unsupported("indexing a list with a tensor")
        idx = real(tr, k)
        try:
            r = c.items[idx]
        except (IndexError, TypeError) as e:
            from ..interpreter import TracedRaise
            raise TracedRaise(e) from None
        if isinstance(idx, slice):
            if c.cls is collections.deque:
                from ..interpreter import TracedRaise
                raise TracedRaise(TypeError("sequence index must be integer, not 'slice'"))
            return ListV(r) if isinstance(c, ListV) else TupleV(r)
        return r
    if isinstance(c, DictV):
        k = dict_key(tr, k)
        if k not in c.items:
            if (x := missing(tr, c, k)) is not None:
                return x
            if getattr(c.cls, "__missing__", None) is not None:
                raise tr.unsupported(f"missing key {k!r} in a {c.cls.__name__}")
            from ..interpreter import TracedRaise
            raise TracedRaise(KeyError(k))
        return c.items[k]
    if isinstance(c, NewObjV):
        if c.dataclass:
            if is_model_output(c.cls):
                key = real(tr, k)
                if isinstance(key, str):
                    return c.attrs[key]
                vals = [x for x in c.attrs.values() if not (isinstance(x, ObjV) and x.value is None)]
                r = vals[key]
                return TupleV(r) if isinstance(key, slice) else r
        gi = getattr(c.cls, "__getitem__", None)
        if isinstance(gi, types.FunctionType):
            return tr.call(ObjV(gi), [c, k], {})
    if isinstance(c, ObjV):
        x = c.value
        if type(x).__module__ == "typing" and _const_like(k):
            # List[Tensor] (timm's torch.jit.annotate): pure and cached; traced, typing's
            # __getitem__ reaches sys._getframe and broke the graph
            return ObjV(x[real(tr, k)])
        gi = getattr(type(x), "__getitem__", None)
        if isinstance(gi, types.FunctionType):
            return _module_getitem(tr, c, k) or tr.call(ObjV(gi), [c, k], {})
        if isinstance(x, type) and isinstance(k, ObjV):
            return ObjV(x[k.value])           # typing generics
        if isinstance(k, ObjV) or _const_like(k):
            key = real(tr, k)
            try:
                r = x[key]
            except Exception as e:  # noqa: BLE001
                from ..interpreter import TracedRaise
                raise TracedRaise(e) from None
            if c.source is not None and not isinstance(key, slice):
                return tr.wrap(r, tr.item_source(c.source, key, frozen=type(x) is tuple))
            return tr.wrap(r, None) if not isinstance(r, (tuple, list, str)) else tr.const_value(r)
    raise tr.unsupported(f"subscript of {type(c).__name__}")


def _module_getitem(tr, c, k):
    """Sequential/ModuleList with an int or a slice: the submodule, sources kept; a slice is
    the container eager makes (same class, same submodules), whose submodules the trace reads
    through their own sources and residual code makes again as `container[slice]`."""
    import torch
    from ..interpreter import TracedRaise
    from ..values import NewModuleV
    x = c.value
    if not isinstance(x, (torch.nn.Sequential, torch.nn.ModuleList)) or not isinstance(k, ObjV):
        return None
    ov = tr.overlay.get((id(x), "_modules"))
    if ov is not None:                       # itself a slice made in the trace
        keys = list(ov.items)
        get = ov.items.__getitem__
    elif c.source is None:
        raise tr.unsupported(f"indexing a {type(x).__name__} made in the traced code")
    else:
        from ..sources import AttrSource, DictEntrySource
        keys = list(x._modules.keys())
        tr.guard("KEYS", AttrSource(c.source, "_modules", structural=True), keys)

        def get(key):
            return tr.wrap(x._modules[key], DictEntrySource(c.source, "_modules", key))
    idx = k.value
    if isinstance(idx, slice):
        new = x[idx]
        sub = DictV({nk: get(ok) for nk, ok in zip(new._modules, keys[idx])})
        tr.keepalive.append(new)
        tr.overlay[(id(new), "_modules")] = sub
        return NewModuleV(new, [c, k], {}, fn=operator.getitem)
    if isinstance(idx, int):
        try:
            return get(keys[idx])
        except IndexError:
            raise TracedRaise(IndexError(f"index {idx} is out of range")) from None
    return None


@handler("BINARY_SUBSCR")
def binary_subscr(tr, f, ins):
    k, c = f.pop(), f.pop()
    f.push(getitem(tr, c, k))


@handler("BINARY_SLICE", since=(3, 12))
def binary_slice(tr, f, ins):
    end, start, c = f.pop(), f.pop(), f.pop()
    f.push(getitem(tr, c, _slice(tr, start, end, ObjV(None))))


def _slice(tr, *parts):
    # a bound that is a tensor made from numbers (DeBERTa's att_span = torch.tensor(min(...)))
    # is read by eager through __index__: the trace knows its value (numbers.py)
    parts = [ObjV(n) if isinstance(p, TensorV) and
             (n := numbers.value_of(tr, p, "__index__")) is not None else p for p in parts]
    if all(isinstance(p, ObjV) for p in parts):
        return ObjV(slice(*[p.value for p in parts]))
    raise tr.unsupported("slice with traced bounds")


def setitem(tr, c, k, v):
    from ..builtins import _mutate, real
    tr.writes += 1
    if isinstance(c, TensorV):
        tr.call_graph(operator.setitem, [c, k, v], {})
        return
    if isinstance(c, ListV):
        _mutate(tr, c)
        idx = real(tr, k)
        if isinstance(idx, slice):
            from ..builtins import iterate
            c.items[idx] = iterate(tr, v)
        else:
            c.items[idx] = v
        return
    if isinstance(c, DictV):
        _mutate(tr, c)
        c.items[dict_key(tr, k)] = v
        return
    if isinstance(c, NewObjV):
        si = getattr(c.cls, "__setitem__", None)
        if c.dataclass:
            if is_model_output(c.cls):
                from ..attrs import refuse_input_write
                refuse_input_write(tr, c, f"item {real(tr, k)!r}")
                c.attrs[real(tr, k)] = v
                return
        if isinstance(si, types.FunctionType):
            tr.call(ObjV(si), [c, k, v], {})
            return
    raise tr.unsupported(f"item assignment on {type(c).__name__}")


@handler("STORE_SUBSCR")
def store_subscr(tr, f, ins):
    k, c, v = f.pop(), f.pop(), f.pop()
    setitem(tr, c, k, v)


@handler("STORE_SLICE", since=(3, 12))
def store_slice(tr, f, ins):
    end, start, c, v = f.pop(), f.pop(), f.pop(), f.pop()
    setitem(tr, c, _slice(tr, start, end, ObjV(None)), v)


@handler("DELETE_SUBSCR")
def delete_subscr(tr, f, ins):
    from ..builtins import _mutate, real
    k, c = f.pop(), f.pop()
    if isinstance(c, (ListV, DictV)):
        k = dict_key(tr, k) if isinstance(c, DictV) else real(tr, k)
        try:
            del c.items[k]
        except (IndexError, KeyError, TypeError) as e:
            from ..interpreter import TracedRaise
            raise TracedRaise(e) from None
        _mutate(tr, c)          # replayed on the caller's container, applied to a fresh one
        return
    if isinstance(c, TensorV) or isinstance(c, TupleV):
        from ..interpreter import TracedRaise
        raise TracedRaise(TypeError(f"'{c.python_type().__name__}' object doesn't support item "
                                    "deletion"))
    di = getattr(c.cls if isinstance(c, NewObjV) else type(c.value) if isinstance(c, ObjV)
                 else None, "__delitem__", None)
    if isinstance(di, types.FunctionType):
        tr.call(ObjV(di), [c, k], {})
        return
    raise tr.unsupported(f"del on {type(c).__name__}")


@handler("BUILD_SLICE")
def build_slice(tr, f, ins):
    parts = f.popn(ins.arg)
    f.push(_slice(tr, *parts) if len(parts) == 3 else _slice(tr, parts[0], parts[1], ObjV(None)))


__all__ = ["binary", "unary", "getitem", "setitem", "NULL"]
