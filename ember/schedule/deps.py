"""Stage 5, schedule: read/write sets of loop-IR nodes, found by running their bodies.

Every computed node's body runs once under `DepsHandler` with canonical loop variables
`v0, v1, ...` (outer dims first, then reduced dims; size-1 dims dropped), so a read index of a
buffer can be compared directly with the index its producer writes it at. Extern nodes read the
buffers named in their `TensorArg`s.

Consumes: lower's ComputedBuffer / ExternBuffer nodes (duck-typed). Produces: `NodeDeps`.
"""
from __future__ import annotations

import itertools

import sympy

from ..loopir.index import is_symbolic, sym
from ..loopir.ops import OpsHandler, set_handler
from ..loopir.plan import NodeDeps


class DepsHandler(OpsHandler):
    def __init__(self):
        self.reads: dict = {}
        self.writes: dict = {}
        self.indirect = False
        self.ind_sizes: dict = {}
        self._ids = itertools.count()

    def load(self, name, index):
        self.reads.setdefault(name, set()).add(sympy.expand(index))
        return None

    def store(self, name, index, value):
        self.writes[name] = sympy.expand(index)
        return None

    def indirect_indexing(self, value, size, check=True):
        self.indirect = True
        s = sym(f"ind{next(self._ids)}")
        self.ind_sizes[s] = size
        return s

    def masked(self, mask, body, other):
        return body()

    def default(self, name, *args, **kwargs):
        return None


def loop_vars(n, start=0):
    return [sym(f"v{i}") for i in range(start, start + n)]


def node_deps(node) -> NodeDeps:
    if node.kind == "extern":
        reads = {}
        for arg in tensor_args(node):
            reads.setdefault(arg.buffer.name, None)
        return NodeDeps(reads, None)
    h = DepsHandler()
    xv = loop_vars(len(node.ranges))
    with set_handler(h):
        if node.kind == "pointwise":
            node.store_pointwise(xv)
            write = h.writes[node.name]
        else:
            node.reduction_value(xv, loop_vars(len(node.rranges), len(xv)))
            write = sympy.expand(node.store_index(xv))
    return NodeDeps(h.reads, write, h.indirect, h.ind_sizes)


def row_gather(read, write, outer: int, reader_inner, writer_inner, ind_sizes) -> bool:
    """Does `read` (by a node looping over outer dims + `reader_inner`) fall in the row that
    `write` (by a node over the same outer dims + `writer_inner`) stores in the same outer
    iteration? The writer must store its row densely (row-major over its inner dims) and the
    read's part along the inner dims, indirect indices included (in [0, size): wrapped and
    checked), must lie in [0, row) for every index. Once the writer's stage has run, a later
    stage may then read any element of it (a separable interpolation: the second pass gathers
    from the row the first just computed)."""
    if read is None or write is None or not writer_inner:
        return False
    inner_w = loop_vars(len(writer_inner), outer)
    inner_r = loop_vars(len(reader_inner), outer)
    zero_w = {v: 0 for v in inner_w}
    w_outer = write.xreplace(zero_w)
    row, dense = 1, sympy.Integer(0)
    for v, n in reversed(list(zip(inner_w, writer_inner))):
        if is_symbolic(n):
            return False
        dense += v * row
        row *= int(n)
    if sympy.expand(write - w_outer - dense) != 0:
        return False
    ranges = dict(zip(inner_r, reader_inner))
    ranges.update(ind_sizes)
    offset = sympy.expand(read - w_outer)       # the read's position in the writer's row
    if not offset.free_symbols <= set(ranges):
        return False
    lo = hi = 0
    for term in sympy.Add.make_args(offset):
        coef, rest = term.as_coeff_Mul()
        if coef.is_Integer and rest == 1:
            lo, hi = lo + int(coef), hi + int(coef)
            continue
        if not (coef.is_Integer and rest in ranges) or is_symbolic(ranges[rest]):
            return False
        span = int(coef) * (int(ranges[rest]) - 1)
        lo, hi = lo + min(span, 0), hi + max(span, 0)
    return 0 <= lo and hi < row


def tensor_args(node):
    """Every TensorArg in an extern's args/kwargs (recursing into lists)."""
    out = []

    def walk(a):
        if hasattr(a, "buffer") and hasattr(a, "stride"):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)
    walk(node.args)
    walk(node.kwargs)
    return out
