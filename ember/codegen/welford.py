"""Stage 6, codegen (Triton): var_mean's pair of sums, found by shape.

For Triton the lowering turns var_mean (and so BatchNorm, LayerNorm, GroupNorm) into S = sum(x)
and, in the next stage of the same kernel, Q = sum((x - S * (1/n))**2) (for C++ it sums in
double instead, lower/rules.py `_var_mean_double`). Two loops over the same long rows read them
twice from memory; `find_welford` recognises the pair by comparing the bodies as trees (run
under `_TreeHandler`) so Triton's looped Welford (triton_welford.py) makes one pass over memory.

Consumes: a Kernel. Produces: {stage index of S: (S node, stage index of Q)}.
"""
from __future__ import annotations

import sympy

from ..loopir.index import numel
from ..loopir.ops import OpsHandler, set_handler
from .cpp_loops import loop_var


class _TreeHandler(OpsHandler):
    """Bodies as nested tuples, to compare two bodies structurally."""

    def load(self, name, index):
        return ("load", name, sympy.expand(index))

    def constant(self, value, dtype):
        return ("const", value, dtype)

    def index_expr(self, expr, dtype):
        return ("index", sympy.expand(expr), dtype)

    def indirect_indexing(self, value, size, check=True):
        raise _NoMatch

    def masked(self, mask, body, other):
        raise _NoMatch

    def default(self, name, *args):
        return (name,) + args


class _NoMatch(Exception):
    pass


def _tree(fn):
    try:
        with set_handler(_TreeHandler()):
            return fn()
    except _NoMatch:
        return None


def find_welford(kernel, xv, m) -> dict:
    """{stage index a: (S node, stage index b)} where stage a is [S = sum(A)] and stage a+1 is
    [Q = sum((A - S * (1/n))**2)] over the same row (what var_mean lowers to)."""
    out = {}
    stages = kernel.stages
    for a in range(len(stages) - 1):
        sa, sb = stages[a], stages[a + 1]
        if (sa.kind, sb.kind) != ("reduction", "reduction") or len(sa.nodes) != 1 or \
                len(sb.nodes) != 1 or tuple(sa.inner) != tuple(sb.inner) or a in out or \
                any(b == a for _, b in out.values()):
            continue
        s, q = sa.nodes[0], sb.nodes[0]
        if s.body.reduction_type != "sum" or q.body.reduction_type != "sum" or \
                not s.body.src_dtype.is_floating_point or s.body.src_dtype != q.body.src_dtype:
            continue
        rv = [loop_var(m + i) for i in range(len(sa.inner))]
        ta = _tree(lambda: s.reduction_value(xv, rv))
        tq = _tree(lambda: q.reduction_value(xv, rv))
        if ta is None or tq is None or tq[0] != "mul" or tq[1] != tq[2] or tq[1][0] != "sub":
            continue
        _, lhs, mean = tq[1]
        n = (numel(sa.inner) if sa.inner else 1)
        try:
            ok = (lhs == ta and mean[0] == "mul" and mean[1][:2] == ("load", s.name)
                  and mean[1][2] == sympy.expand(s.store_index(xv)) and mean[2][0] == "const"
                  and n > 0 and abs(float(mean[2][1]) * n - 1) < 1e-9)
        except (TypeError, IndexError):
            ok = False
        if ok:
            out[a] = (s, a + 1)
    return out
