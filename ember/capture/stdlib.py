"""Capture, collections: namedtuple classes and deques made in the traced code (registered in
builtins.BUILTINS; deque methods reached through builtins.container_method), and writes to a
caller's set.

`collections.namedtuple(...)` over constant arguments runs at trace time: the class it makes is
the one the compiled code returns instances of (eager makes a new, equal class per call).
A deque made in the trace is a list value of class `collections.deque` (maxlen=None only): its
methods act on the items, and residual code builds `deque([...])`. A caller's deque stays a
real object, guarded by type; mutating it in the trace is refused (calls.py).
A caller's set written in the trace (`s.add(3)`, `s |= {3}`) is copied once into a set the
trace owns; later reads see the copy (a set read through two names is one value: inputs.py), and its final contents replace the caller's set's after
the graph (the same object, as eager mutates it in place).
"""
from __future__ import annotations

import collections
import copy

import torch

from .builtins import BUILTINS, fold, iterate, real
from .scalar_args import REWRITES
from .sources import AttrSource
from ..errors import Unsupported
from .values import DictV, ListV, ObjV, TupleV, V, is_literal


def _namedtuple(tr, args, kwargs):
    if not all(isinstance(a, ObjV) for a in (*args, *kwargs.values())):
        from .builtins import real as _real
        args = [ObjV(_real(tr, a)) for a in args]
        kwargs = {k: ObjV(_real(tr, x)) for k, x in kwargs.items()}
    return fold(tr, collections.namedtuple, args, kwargs)


BUILTINS[collections.namedtuple] = _namedtuple


def _plain_state(x, objects: bool, depth: int = 0) -> bool:
    """Whether `x` holds only literals and containers of them — and, with `objects`, plain
    objects of them (a nested config) — no tensor, module or callable."""
    if is_literal(x) or x is None:
        return True
    if depth > 4 or isinstance(x, (torch.Tensor, torch.nn.Module)):
        return False
    if type(x) in (list, tuple, set, frozenset):
        return all(_plain_state(i, objects, depth + 1) for i in x)
    if type(x) is dict:
        return all(is_literal(k) and _plain_state(i, objects, depth + 1) for k, i in x.items())
    d = getattr(x, "__dict__", None)
    return objects and type(d) is dict and type(x).__module__ != "builtins" and \
        not isinstance(x, type) and _plain_state(d, objects, depth + 1)


def copy_plain_object(fn):
    """`copy.deepcopy(obj)` / `copy.copy(obj)` of a caller's object holding plain state only (a
    transformers config: `get_text_config` deep-copies legacy encoder-decoder configs, on every
    BART/T5/Marian forward that makes a cache) is done at trace time: the copy belongs to the
    trace (its attributes are constants of the graph, writes to it happen at trace time) and a
    guard re-checks, on every call, that the object's __dict__ still equals what was copied.
    Anything else (None: not handled here) is traced through the copy module as before."""
    def rewrite(tr, args, kwargs):
        if len(args) != 1 or kwargs:
            return None
        v = args[0]
        if isinstance(v, (ListV, TupleV, DictV)):   # a container of literals (config.to_dict)
            try:
                x = real(tr, v)
            except Unsupported:
                return None
            # literals only: an object inside would be copied with no guard on its attributes
            return tr.const_value(fn(x)) if _plain_state(x, objects=False) else None
        if not isinstance(v, ObjV):
            return None
        x = v.value
        if v.source is None or isinstance(x, (list, dict, set, tuple)) or \
                not _plain_state(x, objects=True):
            return None
        snapshot = copy.deepcopy(x.__dict__)
        if not snapshot == x.__dict__:      # an object inside compares by identity: no guard
            return None
        tr.guard("EQ", AttrSource(v.source, "__dict__"), snapshot)
        out = fn(x)
        tr.own(out)
        return ObjV(out)
    return rewrite


REWRITES[copy.deepcopy] = copy_plain_object(copy.deepcopy)
REWRITES[copy.copy] = copy_plain_object(copy.copy)


def new_deque(tr, args, kwargs) -> V:
    """`collections.deque(iterable=(), maxlen=None)`."""
    maxlen = kwargs.get("maxlen", args[1] if len(args) > 1 else ObjV(None))
    if len(args) > 2 or set(kwargs) - {"iterable", "maxlen"} or real(tr, maxlen) is not None:
        raise tr.unsupported("collections.deque with a maxlen")
    src = args[0] if args else kwargs.get("iterable")
    return ListV(iterate(tr, src) if src is not None else [], cls=collections.deque)


BUILTINS[collections.deque] = new_deque


def deque_method(tr, d: ListV, name: str, args, kwargs) -> V:
    """A method of a deque value; None where list's own method does the same."""
    from .builtins import _mutate
    it = d.items
    if name == "appendleft":
        _mutate(tr, d)
        it.insert(0, args[0])
        return ObjV(None)
    if name == "extendleft":
        _mutate(tr, d)
        for x in iterate(tr, args[0]):
            it.insert(0, x)
        return ObjV(None)
    if name in ("popleft", "pop"):
        if args:
            from .interpreter import TracedRaise
            raise TracedRaise(TypeError(f"deque.{name}() takes no arguments"))
        if not it:
            from .interpreter import TracedRaise
            raise TracedRaise(IndexError(f"{name} from an empty deque"))
        _mutate(tr, d)
        return it.pop(0 if name == "popleft" else -1)
    if name == "rotate":
        n = real(tr, args[0]) if args else 1
        if it:
            _mutate(tr, d)
            n %= len(it)
            it[:] = it[len(it) - n:] + it[:len(it) - n]
        return ObjV(None)
    if name == "copy":
        return ListV(list(it), cls=collections.deque)
    if name in ("sort", "__getitem__") or kwargs:
        raise tr.unsupported(f"deque.{name} with these arguments")
    return None


SET_WRITES = {"add", "discard", "remove", "pop", "clear", "update", "difference_update",
              "intersection_update", "symmetric_difference_update"}


def writable_set(tr, v: ObjV) -> set:
    """The set `v` holds, safe to mutate at trace time (see the module docstring)."""
    s = v.value
    if id(s) in tr.owned:
        return s
    if type(s) is not set or v.source is None:
        raise tr.unsupported(f"{type(s).__name__} written in place at trace time")
    c = set(s)
    tr.own(c)
    v.value = c
    tr.writes += 1
    tr.mutated.append(v)
    return c
