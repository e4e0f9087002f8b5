"""Stage 6, codegen: index compares decided over loop ranges (cat and pad along a loop).

A cat or a pad along a dim compares that dim's index with constants (`ops.index_expr(v) >= 2048`)
and selects between masked bodies. Along the contiguous `omp simd` loop the vectorized code then
evaluates every input's body for every element, masked (chunk's backward `cat` ran both SiLU
gradients per element). `split_points` finds where such compares change value along the innermost
loop var, the kernel loop is emitted as one loop per segment between them (cpp.py), and
`decide` lets the handler fold each compare to a constant inside a segment (cpp_handler.py), so
each segment keeps only its own body.

Consumes: index expressions (sympy) and loop ranges. Produces: split points, decided compares.
"""
from __future__ import annotations

import sympy

from ..loopir.index import simplify_index
from ..loopir.ops import OpsHandler, set_handler

CMP = ("lt", "le", "gt", "ge", "eq", "ne")
SWAP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
#: a split loop has at most this many segments (a many-way cat keeps its masks)
MAX_SEGMENTS = 8


def affine(e):
    """(c0, {var: c}) with integer coefficients for an affine index expression, else None."""
    e = sympy.expand(e)
    coeffs = {v: e.coeff(v) for v in e.free_symbols}
    rest = sympy.expand(e - sum((c * v for v, c in coeffs.items()), sympy.Integer(0)))
    if not rest.is_Integer or not all(isinstance(c, sympy.Integer) for c in coeffs.values()):
        return None
    return int(rest), {v: int(c) for v, c in coeffs.items()}


def bounds(e, ranges: dict, spans: dict):
    """[lo, hi] of an affine e for vars in spans ({var: (lo, hi)}, hi exclusive) or in ranges
    ({var: size}, from 0), or None when e is not affine or a var's range is unknown."""
    a = affine(e)
    if a is None:
        return None
    lo = hi = a[0]
    for v, c in a[1].items():
        if v in spans:
            vlo, vhi = spans[v][0], spans[v][1] - 1
        elif isinstance(ranges.get(v), (int, sympy.Integer)) and int(ranges[v]) > 0:
            vlo, vhi = 0, int(ranges[v]) - 1
        else:
            return None
        lo, hi = lo + min(c * vlo, c * vhi), hi + max(c * vlo, c * vhi)
    return lo, hi


def decide(cmp: str, lo: int, hi: int, k) -> bool | None:
    """`x cmp k` for every x in [lo, hi]: True, False, or None when it depends on x."""
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        return None
    table = {"lt": (hi < k, lo >= k), "le": (hi <= k, lo > k), "gt": (lo > k, hi <= k),
             "ge": (lo >= k, hi < k), "eq": (lo == hi == k, k < lo or k > hi),
             "ne": (k < lo or k > hi, lo == hi == k)}
    always, never = table[cmp]
    return True if always else (False if never else None)


class SplitPoints(OpsHandler):
    """Runs a body and collects the values of `var` in (0, size) where a compare of an index
    `var + c` or `-var + c` with a constant changes value."""

    def __init__(self, var, size: int, ranges: dict, subs: dict):
        self.var, self.size, self.ranges, self.subs = var, size, ranges, subs
        self.points: set[int] = set()

    def index_expr(self, expr, dtype):
        return ("idx", simplify_index(sympy.expand(expr), self.ranges).xreplace(self.subs))

    def constant(self, value, dtype):
        return ("c", value)

    def masked(self, mask, body, other):
        return body()

    def indirect_indexing(self, value, size, check=True):
        return sympy.Symbol("indirect")

    def default(self, name, *args, **kwargs):
        if name not in CMP or len(args) != 2:
            return None
        a, b = args
        if isinstance(b, tuple) and b[0] == "idx" and not (isinstance(a, tuple) and a[0] == "idx"):
            a, b, name = b, a, SWAP[name]
        if not (isinstance(a, tuple) and a[0] == "idx"):
            return None
        k = b[1] if isinstance(b, tuple) and b[0] == "c" else b
        k = int(k) if isinstance(k, sympy.Integer) else k
        form = affine(a[1])
        if form is None or set(form[1]) != {self.var} or isinstance(k, bool) \
                or not isinstance(k, int) or form[1][self.var] not in (1, -1):
            return None
        c0, c = form[0], form[1][self.var]
        # the compare changes value between var = p - 1 and var = p
        t = k - c0 if c == 1 else c0 - k
        pts = {"lt": [t if c == 1 else t + 1], "ge": [t if c == 1 else t + 1],
               "le": [t + 1 if c == 1 else t], "gt": [t + 1 if c == 1 else t],
               "eq": [t, t + 1], "ne": [t, t + 1]}[name]
        self.points.update(p for p in pts if 0 < p < self.size)
        return None


def split_points(store_fn, var, size, ranges: dict, subs: dict) -> list[tuple[int, int]] | None:
    """Segments [(lo, hi)] of the innermost loop (var over `size`) between which the body's
    index compares change value, or None when there are none (or too many)."""
    h = SplitPoints(var, int(size), ranges, subs)
    with set_handler(h):
        store_fn()
    if not h.points or len(h.points) >= MAX_SEGMENTS:
        return None
    edges = [0] + sorted(h.points) + [int(size)]
    return list(zip(edges[:-1], edges[1:]))
