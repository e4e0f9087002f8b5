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

from .builtins import BUILTINS, fold, iterate, real
from .values import ListV, ObjV, V


def _namedtuple(tr, args, kwargs):
    if not all(isinstance(a, ObjV) for a in (*args, *kwargs.values())):
        from .builtins import real as _real
        args = [ObjV(_real(tr, a)) for a in args]
        kwargs = {k: ObjV(_real(tr, x)) for k, x in kwargs.items()}
    return fold(tr, collections.namedtuple, args, kwargs)


BUILTINS[collections.namedtuple] = _namedtuple


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
