"""Capture, builtins that reduce an iterable of values: set/frozenset/sorted/sum/any/all/min/max
(registered in builtins.BUILTINS).

Over constants they fold; `sum` adds values with the traced `+`; `any/all` step a lazy iterator
only as far as Python would; `sorted/min/max` with a key run the key in the trace (its results
must be constants). `min/max` over one-element tensors (and numbers) is torch.minimum/maximum
(torch.clamp against a number), as Dynamo traces them: eager compares their data.
"""
from __future__ import annotations

import operator
import types

import torch

from .builtins import BUILTINS, iterate, real, step, truth
from .values import STOP, GenV, ListV, ObjV, TensorV

def _make_agg(f):
    def h(tr, args, kwargs):
        if f in (any, all) and len(args) == 1 and isinstance(args[0], GenV):
            # short-circuits: a lazy iterator is stepped only as far as Python would
            while (x := step(tr, args[0])) is not STOP:
                if truth(tr, x) is (f is any):
                    return ObjV(f is any)
            return ObjV(f is all)
        if f is sum and "start" in kwargs:
            kwargs = dict(kwargs)
            args = [args[0], kwargs.pop("start")]
        if f in (min, max) and len(args) > 1:
            items = list(args)
        else:
            items = iterate(tr, args[0]) if args else []
        key = kwargs.get("key")
        if f in (sorted, min, max) and key is not None and not (isinstance(key, ObjV) and (
                key.value is None or isinstance(key.value, (types.BuiltinFunctionType, type)))):
            return _keyed(tr, f, items, key, kwargs)
        from .handlers.ops import _const_like
        if all(_const_like(i) for i in items) and _all_obj(kwargs):
            extra = [real(tr, a) for a in args[1:]] if f not in (min, max) or len(args) == 1 else []
            try:
                return tr.const_value(f([real(tr, i) for i in items], *extra,
                                        **{k: real(tr, x) for k, x in kwargs.items()}))
            except Exception as e:  # noqa: BLE001
                raise tr.unsupported(f"{f.__name__}() raised {type(e).__name__}: {e}")
        if f is sum:
            acc = args[1] if len(args) > 1 else ObjV(0)
            for i in items:
                acc = tr.binary(operator.add, acc, i)
            return acc
        if f in (any, all):
            raise tr.unsupported(f"{f.__name__}() over tensors needs their data")
        if f in (min, max) and not kwargs:
            return _min_max_tensors(tr, f, items)
        if f is set and not kwargs:
            return new_set(tr, items)
        raise tr.unsupported(f"{f.__name__}() over traced values")
    return h


def new_set(tr, items) -> ObjV:
    """A set the trace makes: constants in a real set, other values (tensors) kept by
    identity in `tr.set_members`, as Python hashes them (a tensor's hash is its id)."""
    s = set()
    tr.own(s)
    members = []
    for i in items:
        if isinstance(i, ObjV):
            s.add(real(tr, i))
        elif not any(m is i for m in members):
            members.append(i)
    if members:
        tr.set_members[id(s)] = members
    return ObjV(s)


def _keyed(tr, f, items, key, kwargs):
    """sorted/min/max with a key function the trace runs (its results must be constants)."""
    keys = [real(tr, tr.call(key, [i], {})) for i in items]
    idx = list(range(len(items)))
    if f is sorted:
        # list.sort on the positions: the same stable order, reverse=True included
        idx.sort(key=keys.__getitem__, reverse=bool(real(tr, kwargs.get("reverse", ObjV(False)))))
        return ListV([items[j] for j in idx])
    if not idx:
        if "default" in kwargs:
            return kwargs["default"]
        from .interpreter import TracedRaise
        raise TracedRaise(ValueError(f"{f.__name__}() iterable argument is empty"))
    return items[f(idx, key=keys.__getitem__)]


def _all_obj(kw):
    return all(isinstance(x, ObjV) for x in kw.values())


for _a in (set, frozenset, sorted, sum, any, all, min, max):
    BUILTINS[_a] = _make_agg(_a)


def _min_max_tensors(tr, f, items):
    """min/max of single-element tensors and numbers, pairwise left to right."""
    if not items:
        raise tr.unsupported(f"{f.__name__}() of an empty sequence", hint="fails eagerly")
    shapes = {tuple(i.meta.shape) for i in items if isinstance(i, TensorV)}
    if len(shapes) != 1 or any(not isinstance(i, (TensorV, ObjV)) or isinstance(i, ObjV) and
                               type(i.value) not in (int, float) for i in items) or \
            any(isinstance(i, TensorV) and (i.meta.numel() != 1 or i.meta.dtype == torch.bool)
                for i in items):
            raise tr.unsupported(f"{f.__name__}() over traced values")
    acc = items[0]
    for x in items[1:]:
        if isinstance(acc, TensorV) and isinstance(x, TensorV):
            acc = tr.call_graph(torch.maximum if f is max else torch.minimum, [acc, x], {})
        elif isinstance(acc, ObjV) and isinstance(x, ObjV):
            acc = ObjV(f(acc.value, x.value))
        else:
            t, n = (acc, x) if isinstance(acc, TensorV) else (x, acc)
            acc = tr.call_graph(torch.clamp, [t], {"min" if f is max else "max": n})
    return acc
