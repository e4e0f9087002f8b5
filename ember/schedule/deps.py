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

from ..loopir.index import sym
from ..loopir.ops import OpsHandler, set_handler
from ..loopir.plan import NodeDeps


class DepsHandler(OpsHandler):
    def __init__(self):
        self.reads: dict = {}
        self.writes: dict = {}
        self.indirect = False
        self._ids = itertools.count()

    def load(self, name, index):
        self.reads.setdefault(name, set()).add(sympy.expand(index))
        return None

    def store(self, name, index, value):
        self.writes[name] = sympy.expand(index)
        return None

    def indirect_indexing(self, value, size, check=True):
        self.indirect = True
        return sym(f"ind{next(self._ids)}")

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
    return NodeDeps(h.reads, write, h.indirect)


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
