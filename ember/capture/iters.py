"""Capture, itertools and functools.partial over values (registered in builtins.BUILTINS).

Consumes the argument values of a call to `itertools.chain/product/islice/zip_longest/count/
repeat/accumulate/combinations/permutations/combinations_with_replacement` or
`functools.partial`; produces an iterator value or a PartialV. Iterators are lazy (`GenV` with
a step function) and pull from their inputs exactly as CPython's do, so a
generator feeding them runs only as far as eager would run it; `product` reads its inputs
whole first, as CPython does.
"""
from __future__ import annotations

import functools
import itertools
import operator

from .builtins import BUILTINS, as_iter, builtin, iterate, real, step
from .values import STOP, GenV, IterV, ObjV, PartialV, TupleV


def _lazy(fn, cls) -> GenV:
    return GenV(step=fn, cls=cls)


@builtin(itertools.chain)
def _chain(tr, args, kwargs):
    return _flatten(tr, IterV(list(args)))


def _from_iterable(tr, args, kwargs):
    return _flatten(tr, as_iter(tr, args[0]))


BUILTINS[itertools.chain.from_iterable] = _from_iterable


def _flatten(tr, outer) -> GenV:
    cur = [None]

    def nxt(tr):
        while True:
            if cur[0] is None:
                src = step(tr, outer)
                if src is STOP:
                    return STOP
                cur[0] = as_iter(tr, src)
            x = step(tr, cur[0])
            if x is not STOP:
                return x
            cur[0] = None
    return _lazy(nxt, itertools.chain)


@builtin(itertools.product)
def _product(tr, args, kwargs):
    r = real(tr, kwargs.get("repeat", ObjV(1)))
    lists = [iterate(tr, a) for a in args]
    return IterV([TupleV(t) for t in itertools.product(*lists, repeat=r)])


def _combinatoric(f):
    """combinations/permutations/combinations_with_replacement: like CPython, the input is
    read whole first; the tuples hold the input's values (tensors stay symbolic)."""
    def h(tr, args, kwargs):
        items = iterate(tr, args[0])
        rest = [real(tr, a) for a in [*args[1:], *kwargs.values()]]     # r
        return IterV([TupleV([items[i] for i in t]) for t in f(range(len(items)), *rest)])
    return h


for _f in (itertools.combinations, itertools.permutations,
           itertools.combinations_with_replacement):
    BUILTINS[_f] = _combinatoric(_f)


@builtin(itertools.islice)
def _islice(tr, args, kwargs):
    src = as_iter(tr, args[0])
    bounds = [real(tr, a) for a in args[1:]]
    if len(bounds) == 1:
        start, stop, stride = 0, bounds[0], 1
    else:
        start, stop = bounds[0] or 0, bounds[1]
        stride = (bounds[2] if len(bounds) > 2 else None) or 1
    state = {"cnt": 0, "next": start}

    def nxt(tr):                  # CPython's islice_next, step for step
        while state["cnt"] < state["next"]:
            if step(tr, src) is STOP:
                return STOP
            state["cnt"] += 1
        if stop is not None and state["cnt"] >= stop:
            return STOP
        x = step(tr, src)
        if x is STOP:
            return STOP
        state["cnt"] += 1
        state["next"] += stride
        if stop is not None and state["next"] > stop:
            state["next"] = stop
        return x
    return _lazy(nxt, itertools.islice)


@builtin(itertools.zip_longest)
def _zip_longest(tr, args, kwargs):
    fill = kwargs.get("fillvalue", ObjV(None))
    its = [as_iter(tr, a) for a in args]
    active = [True] * len(its)

    def nxt(tr):
        if not any(active):
            return STOP
        out = []
        for i, it in enumerate(its):
            x = step(tr, it) if active[i] else STOP
            if x is STOP:
                active[i] = False
                x = fill
            out.append(x)
        return TupleV(out) if any(active) else STOP
    return _lazy(nxt, itertools.zip_longest)


@builtin(itertools.count)
def _count(tr, args, kwargs):
    vals = [real(tr, a) for a in args]
    n = [vals[0] if vals else real(tr, kwargs.get("start", ObjV(0)))]
    stride = vals[1] if len(vals) > 1 else real(tr, kwargs.get("step", ObjV(1)))

    def nxt(tr):
        n[0] += stride
        return ObjV(n[0] - stride)
    return _lazy(nxt, itertools.count)


@builtin(itertools.repeat)
def _repeat(tr, args, kwargs):
    obj = args[0]
    times = real(tr, args[1]) if len(args) > 1 else real(tr, kwargs.get("times", ObjV(None)))
    if times is not None:
        return IterV([obj] * max(times, 0))
    return _lazy(lambda tr: obj, itertools.repeat)


_UNSET = object()


@builtin(itertools.accumulate)
def _accumulate(tr, args, kwargs):
    src = as_iter(tr, args[0])
    func = args[1] if len(args) > 1 else kwargs.get("func", ObjV(None))
    initial = kwargs.get("initial", ObjV(None))
    acc = [_UNSET if isinstance(initial, ObjV) and initial.value is None else initial]
    first = [acc[0] is not _UNSET]

    def nxt(tr):
        if first[0]:
            first[0] = False
            return acc[0]
        x = step(tr, src)
        if x is STOP:
            return STOP
        if acc[0] is _UNSET:
            acc[0] = x
        elif isinstance(func, ObjV) and func.value is None:
            acc[0] = tr.binary(operator.add, acc[0], x)
        else:
            acc[0] = tr.call(func, [acc[0], x], {})
        return acc[0]
    return _lazy(nxt, itertools.accumulate)


@builtin(functools.partial)
def _partial(tr, args, kwargs):
    if not args:
        raise tr.unsupported("functools.partial() without a function", hint="fails eagerly")
    fn, rest = args[0], list(args[1:])
    if isinstance(fn, PartialV):          # partial(partial(f, a), b) is partial(f, a, b)
        return PartialV(fn.func, list(fn.args) + rest, {**fn.kwargs, **kwargs})
    return PartialV(fn, rest, kwargs)


@builtin(functools.reduce)
def _reduce(tr, args, kwargs):
    fn, items = args[0], iterate(tr, args[1])
    if len(args) > 2:
        items = [args[2]] + items
    if not items:
        from .interpreter import TracedRaise
        raise TracedRaise(TypeError("reduce() of empty iterable with no initial value"))
    acc = items[0]
    for x in items[1:]:
        acc = tr.call(fn, [acc, x], {})
    return acc
