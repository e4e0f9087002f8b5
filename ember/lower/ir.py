"""Stage 4, lower: tensor values while lowering, over the loop IR's nodes (ember.loopir.nodes).

While lowering, a tensor is a `TensorValue`: `Pending` (an unrealized Pointwise, inlined into its
users), `View` (strided view of a buffer) or `Reindex` (any view as an index function of another
value). Realizing a value makes a loop-IR buffer.

Consumes: loop-IR nodes. Produces: the classes below, used by lowering and its rules.
"""
from __future__ import annotations

import contextvars
from typing import Callable, Optional

import sympy
import torch

from ..loopir.index import FloorDiv, ModularIndexing, contiguous_strides, hint, is_symbolic, numel, sym
from ..loopir.nodes import Buffer, Pointwise, TensorArg
from ..shapes import expr_of


# --- tensor values while lowering ----------------------------------------------------------

class TensorValue:
    size: tuple
    dtype: torch.dtype
    preferred_stride: Optional[tuple] = None   # a graph output's layout: realize it that way

    def loader(self) -> Callable:
        raise NotImplementedError


class Pending(TensorValue):
    """An unrealized pointwise computation; users inline `inner_fn`."""

    def __init__(self, node: Pointwise):
        self.node = node
        self.size, self.dtype = tuple(node.size), node.dtype
        self.realized: Optional["View"] = None

    def loader(self):
        if self.realized is not None:
            return self.realized.loader()
        return self.node.inner_fn


class View(TensorValue):
    """A strided view of a buffer (what externs and outputs need)."""

    def __init__(self, buffer: Buffer, size, stride, offset=0):
        self.buffer = buffer
        self.size, self.stride, self.offset = tuple(size), tuple(stride), as_size(offset)
        self.dtype = buffer.dtype

    def loader(self):
        return self.buffer.loader(self.size, self.stride, self.offset)

    def arg(self) -> TensorArg:
        return TensorArg(self.buffer, self.size, self.stride, self.offset)


class Reindex(TensorValue):
    """`base` seen through an index map: loader(index) = base.loader()(reindex(index)).

    `view_fn`, when set, is the same map as a view op on a strided tensor (reshape, permute):
    once `base` is stored, the value can be a View of that storage instead of a copy."""

    def __init__(self, base: TensorValue, size, reindex: Callable, dtype=None, view_fn=None):
        self.base, self.size, self.reindex = base, tuple(size), reindex
        self.dtype = dtype or base.dtype
        self.view_fn = view_fn
        self.realized: Optional["View"] = None

    def loader(self):
        inner = self.base.loader()
        reindex = self.reindex
        return lambda index: inner(reindex(index))


_META_BASE = None
#: the shape env of the graph being lowered (dynamic shapes), for meta_strided
SHAPE_ENV: contextvars.ContextVar = contextvars.ContextVar("ember_lower_shape_env", default=None)


def meta_strided(size, stride, offset=0):
    """A meta tensor with this layout (views applied to it give the layout of the result).
    Symbolic sizes (sympy) become SymInts of the graph's shape env; read results with as_sizes()."""
    global _META_BASE
    if _META_BASE is None:
        _META_BASE = torch.empty(2 ** 62, dtype=torch.int8, device="meta")
    if any(is_symbolic(x) for x in (*size, *stride, offset)):
        size, stride, offset = meta_sizes(size), meta_sizes(stride), meta_sizes([offset])[0]
    return _META_BASE.as_strided(size, stride, offset)


def meta_sizes(xs) -> list:
    """IR sizes as arguments of a meta-tensor op (SymInts of the graph's env when symbolic)."""
    if not any(is_symbolic(x) for x in xs):
        return list(xs)
    env = SHAPE_ENV.get()
    return [env.symint(x) for x in xs]


def as_size(x):
    """A size/stride for the IR: an int, or a sympy expression when symbolic."""
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        e = expr_of(x)
        return int(e) if e.is_Integer else e
    if isinstance(x, sympy.Basic):
        return int(x) if x.is_Integer else x
    return int(x)


def as_sizes(xs) -> tuple:
    return tuple(as_size(x) for x in xs)


def dense_permutation(t: torch.Tensor) -> bool:
    """Whether t's strides are a dense (non-overlapping, gap-free) permutation of its dims.
    Symbolic strides are ordered by their hints and must then equal the running products
    exactly, else False (the callers' general path): no size guard is recorded, so this is safe
    in a backward compiled after the graph's guards were fixed."""
    def order(d):
        return int(SHAPE_ENV.get().hint(d[0])) if is_symbolic(d[0]) else d[0]
    dims = sorted(((as_size(st), as_size(s)) for s, st in zip(t.shape, t.stride())
                   if as_size(s) != 1), key=order)
    expect = 1
    for st, s in dims:
        if sympy.expand(st - expect) != 0:
            return False
        expect = expect * s
    return True


def view_chain(value: Reindex):
    """(base, view ops innermost first) when `value` is only reshapes/permutes of `base`."""
    fns = []
    while isinstance(value, Reindex) and value.view_fn is not None:
        fns.append(value.view_fn)
        value = value.base
    return value, fns[::-1]


def dense_view(buffer: Buffer) -> View:
    return View(buffer, buffer.size, buffer.stride, 0)


def index_vars(prefix: str, n: int) -> list:
    return [sym(f"{prefix}{i}") for i in range(n)]


def is_contiguous(size, stride) -> bool:
    return all(st == cst for s, st, cst in zip(size, stride, contiguous_strides(size)) if s != 1)


# --- views as values (shared by the view rules and the reductions) ---------------------------

def meta_view(x: View, fn):
    """Apply a view op to a meta tensor with x's layout; the resulting (size, stride, offset)."""
    r = fn(meta_strided(x.size, x.stride, x.offset))
    return View(x.buffer, as_sizes(r.shape), as_sizes(r.stride()), as_size(r.storage_offset()))


def view_impl(x, size):
    size = as_sizes(size)
    if -1 in size:
        known = numel([s for s in size if s != -1])
        size = tuple(numel(x.size) // known if s == -1 else s for s in size)
    if tuple(x.size) == size:
        return x
    if isinstance(x, View):
        try:
            return meta_view(x, lambda t: t.view(meta_sizes(size)))
        except RuntimeError:
            pass
    return Reindex(x, size, _reshape_index(tuple(x.size), size), view_fn=lambda t: t.view(meta_sizes(size)))


def _reshape_index(old, new):
    """index over `new` → index over `old` via matching dimension groups."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi == pj and (gi or gj) and (i >= len(old) or old[i] != 1 or pi != 1) and (
                    j >= len(new) or new[j] != 1 or pj != 1):
                break
            if (hint(pi) <= hint(pj) or j >= len(new)) and i < len(old):
                gi.append(i); pi *= old[i]; i += 1
            elif j < len(new):
                gj.append(j); pj *= new[j]; j += 1
            else:
                break
        groups.append((gi, gj))

    def reindex(index):
        out = [sympy.Integer(0)] * len(old)
        for gi, gj in groups:
            flat = sympy.Integer(0)
            for jj, st in zip(gj, contiguous_strides([new[k] for k in gj])):
                flat = flat + index[jj] * st
            sts = contiguous_strides([old[k] for k in gi])
            for n, (ii, st) in enumerate(zip(gi, sts)):
                if old[ii] == 1:
                    continue
                if len(gi) == 1:
                    out[ii] = flat
                elif n == 0:
                    out[ii] = FloorDiv(flat, sympy.sympify(st))
                else:
                    out[ii] = ModularIndexing(flat, sympy.sympify(st), sympy.sympify(old[ii]))
        return out
    return reindex
