"""Stage 4, lower: the loop IR.

Buffers are named allocations with a strided layout: `InputBuffer` (graph placeholders and
constants), `ComputedBuffer` (a `Pointwise` or `Reduction` body stored to a dense layout) and
`ExternBuffer` (an aten call: mm/convolution/... or a fallback op). While lowering, a tensor is a
`TensorValue`: `Pending` (an unrealized Pointwise, inlined into its users), `View` (strided view of
a buffer) or `Reindex` (any view as an index function of another value). Bodies are define-by-run
functions of sympy indices that call `ops` (ember.codegen.common).

Consumes: nothing. Produces: the classes below, used by lowering, schedule and codegen.
"""
from __future__ import annotations

import contextvars
import dataclasses
from typing import Any, Callable, Optional

import sympy
import torch

from ..codegen.common import contiguous_strides, is_symbolic, numel, ops, strided_index, sym
from ..shapes import expr_of


# --- loop bodies ---------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Pointwise:
    size: tuple
    dtype: torch.dtype
    inner_fn: Callable  # index (list of sympy) -> ops value (compute dtype of `dtype`)


@dataclasses.dataclass(eq=False)
class Reduction:
    size: tuple                 # output size (reduced dims kept as 1 or dropped, as eager)
    reduction_size: tuple       # sizes of the reduced dims, in loop order
    reduction_type: str         # sum prod max min argmax argmin any
    dtype: torch.dtype          # output dtype
    src_dtype: torch.dtype      # compute dtype of the reduced value
    inner_fn: Callable          # (index, rindex) -> ops value


# --- buffers -------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Buffer:
    name: str
    dtype: torch.dtype
    size: tuple
    stride: tuple

    def loader(self, size=None, stride=None, offset=0):
        stride = self.stride if stride is None else stride
        name = self.name

        def load(index):
            return ops.load(name, strided_index(index, stride, offset))
        return load

    @property
    def numel(self) -> int:
        return numel(self.size)

    def storage_numel(self) -> int:
        if any(s == 0 for s in self.size):
            return 0
        return 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))


@dataclasses.dataclass(eq=False)
class InputBuffer(Buffer):
    position: int = -1              # placeholder position, or -1 for a constant
    constant: Any = None            # the tensor, for get_attr constants
    symbol: Any = None              # a size-symbol placeholder (dynamic shapes): its sympy Symbol


@dataclasses.dataclass(eq=False)
class ComputedBuffer(Buffer):
    body: Any = None                # Pointwise | Reduction

    @property
    def kind(self) -> str:
        return "reduction" if isinstance(self.body, Reduction) else "pointwise"

    # Canonical loops drop size-1 dims: vars x0.. range over the non-1 sizes.
    @property
    def ranges(self) -> tuple:
        return tuple(s for s in self.body.size if s != 1)

    @property
    def rranges(self) -> tuple:
        if isinstance(self.body, Reduction):
            return tuple(s for s in self.body.reduction_size if s != 1)
        return ()

    def _expand(self, size, vars_):
        it = iter(vars_)
        return [sympy.Integer(0) if s == 1 else next(it) for s in size]

    def store_index(self, xvars):
        return strided_index(self._expand(self.body.size, xvars), self.stride)

    def store_pointwise(self, xvars):
        """Run the body at loop vars `xvars` and store it (pointwise only)."""
        index = self._expand(self.body.size, xvars)
        value = self.body.inner_fn(index)
        return ops.store(self.name, strided_index(index, self.stride), value)

    def reduction_value(self, xvars, rvars):
        body = self.body
        return body.inner_fn(self._expand(body.size, xvars), self._expand(body.reduction_size, rvars))


@dataclasses.dataclass(eq=False)
class ExternBuffer(Buffer):
    """Result of one aten call. `args`/`kwargs` hold `TensorArg`s where tensors go. A multi-output
    call is one ExternBuffer with `outputs` (its MultiOutput buffers) and `size=None`."""
    op: Any = None
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    out_variant: Any = None         # e.g. aten.mm.out: write into a preallocated buffer
    outputs: list = dataclasses.field(default_factory=list)
    fallback: bool = False

    @property
    def kind(self) -> str:
        return "extern"


@dataclasses.dataclass(eq=False)
class MultiOutput(Buffer):
    """Element `path` (tuple of indices) of a multi-output extern's result."""
    parent: Any = None
    path: tuple = ()


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A strided view of a buffer handed to an extern or returned from the graph."""
    buffer: Buffer
    size: tuple
    stride: tuple
    offset: int = 0

    @property
    def is_whole(self) -> bool:
        return (self.offset == 0 and tuple(self.size) == tuple(self.buffer.size)
                and tuple(self.stride) == tuple(self.buffer.stride))


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
