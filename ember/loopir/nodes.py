"""The loop IR's nodes: loop bodies and the buffers they are stored to (produced by lower).

Buffers are named allocations with a strided layout: `InputBuffer` (graph placeholders and
constants), `ComputedBuffer` (a `Pointwise` or `Reduction` body stored to a dense layout) and
`ExternBuffer` (an aten call: mm/convolution/... or a fallback op; `MultiOutput` for each element
of a multi-output call). Bodies are define-by-run functions of sympy indices that call `ops`.
A `TensorArg` is a strided view of a buffer handed to an extern or returned from the graph.

Consumes: nothing. Produces: the classes below, built by lower, read by schedule and codegen.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import sympy
import torch

from .index import numel, strided_index
from .ops import ops


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


@dataclasses.dataclass(eq=False)
class Scan(Pointwise):
    """An inclusive running sum along `dim` (cumsum; `reverse`: from the end, the gradient of a
    cumsum). `inner_fn(index)` is the scanned value at `index` (compute dtype of `dtype`); the
    buffer stores the sums. To dependency analysis it is a pointwise body reading the input at
    every index; the scheduler keeps it alone in its kernel and codegen/cpp_scan.py emits the
    loop (the scanned dim sequential, an accumulator per lane). Never inlined: lower stores it."""
    dim: int = 0
    reverse: bool = False


@dataclasses.dataclass(eq=False)
class Scatter(Pointwise):
    """out = the base with `src` scattered along `dim`: for each position p of `index` (whose
    size is the output's except at `dim`, `count` there), out[p with dim = index[p]] += src[p]
    (`accumulate`; else =). A row (all dims but `dim`) receives only from its own row of index
    and src, so rows are independent, and within a row codegen/cpp_scatter.py walks p[dim] =
    0..count-1 in order: eager's serial loop, its sums bit for bit. `base_fn(index)` is the
    base at `index`; `index_fn(p)` / `src_fn(p)` the index (int64) and the value (compute dtype)
    at p. `inner_fn` is what dependency analysis sees: the base at the written index, and the
    index and src at p = the written index with `dim` replaced by the symbol SCATTER_K (a read
    at no written index: the kernel is never in place over them). Like a Scan it is stored
    (never inlined), alone in its kernel, and C++ only."""
    dim: int = 0
    count: int = 0
    accumulate: bool = True
    base_fn: Callable = None
    index_fn: Callable = None
    src_fn: Callable = None


SCATTER_K = sympy.Symbol("scatter_k", integer=True, nonnegative=True)


def scatter_body(size, dtype, dim, count, accumulate, base_fn, index_fn, src_fn) -> Scatter:
    def seen(index):
        p = [*index[:dim], SCATTER_K, *index[dim + 1:]]
        index_fn(p)
        return ops.add(base_fn(index), src_fn(p))
    return Scatter(size, dtype, seen, dim=dim, count=count, accumulate=accumulate,
                   base_fn=base_fn, index_fn=index_fn, src_fn=src_fn)


def owns_loops(node) -> bool:
    """A scan or a scatter: its codegen emits its own loop nest, and it shares no kernel."""
    return isinstance(getattr(node, "body", None), (Scan, Scatter))


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
    origin: str = ""                # the graph node lowered when it was realized (profile labels)

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
