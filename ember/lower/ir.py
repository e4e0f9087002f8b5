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

from ..loopir.index import contiguous_strides, is_symbolic, sym
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
