"""Stage 6, codegen: index compares decided over loop ranges (cat and pad along a loop).

A cat or a pad along a dim compares that dim's index with constants (`ops.index_expr(v) >= 2048`)
and selects between masked bodies. Along the contiguous `omp simd` loop the vectorized code then
evaluates every input's body for every element, masked (chunk's backward `cat` ran both SiLU
gradients per element). `split_points` finds where such compares change value along a loop var,
the kernel loop is emitted as one loop per segment between them (cpp.py), and `decide` lets the
handler fold each compare to a constant inside a segment (cpp_handler.py), so each segment keeps
only its own body.

Along the innermost loop the segments are simd loops side by side. A compare on an *outer* loop
var (cat along channels of NCHW, pad of H, a stack, the where-trees of a scan's up/down sweeps)
does not change along the simd loop, but its select still evaluates every branch there (a 4-part
channel cat loaded 4 values per element): `unswitch` splits such outer loops too, and the kernel
emits its loop nest once per combination of their segments (bounded by MAX_UNSWITCH).

Dynamic shapes (docs/design/058): a boundary may be a size expression (a KV-cache cat at `s0`
along a loop of `s0 + 1`). Split points, segment order and decided compares then hold for
every size: `surely_le` proves them with each size symbol >= 2, and what it cannot prove stays
a select. The innermost loop of symbolic length is not split (cpp.py).

Consumes: index expressions (sympy) and loop ranges. Produces: split points, decided compares.
"""
from __future__ import annotations

import sympy

from ..loopir.index import (SIZE_NAME, FloorDiv, ModularIndexing, hint, is_symbolic,
                            simplify_index, surely_positive)
from ..loopir.ops import OpsHandler, set_handler

CMP = ("lt", "le", "gt", "ge", "eq", "ne")
SWAP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
#: a split loop has at most this many segments (a many-way cat keeps its masks)
MAX_SEGMENTS = 8
#: an unswitched loop nest is emitted at most this many times (one per combination of the outer
#: dims' segments); beyond it the dims with the most segments keep their selects
MAX_UNSWITCH = 16


def is_size(e) -> bool:
    """A number or an expression of size symbols only (no loop var): a compare's constant side
    in a graph with dynamic shapes (a cat at `s0`)."""
    return all(SIZE_NAME.fullmatch(v.name) for v in sympy.sympify(e).free_symbols)


def affine(e):
    """(c0, {var: c}) for an index expression affine in the loop vars with integer
    coefficients, else None. c0 is an int, or a size expression (dynamic shapes)."""
    e = sympy.expand(e)
    coeffs = {v: e.coeff(v) for v in e.free_symbols if not SIZE_NAME.fullmatch(v.name)}
    rest = sympy.expand(e - sum((c * v for v, c in coeffs.items()), sympy.Integer(0)))
    if not is_size(rest) or not all(isinstance(c, sympy.Integer) for c in coeffs.values()):
        return None
    return (int(rest) if rest.is_Integer else rest), {v: int(c) for v, c in coeffs.items()}


def surely_le(a, b) -> bool:
    """a <= b for every allowed size: numbers compared, else b - a with each size symbol
    s = 2 + d (sizes 0 and 1 specialize, shapes.py) expands to non-negative terms."""
    d = sympy.expand(sympy.sympify(b) - a)
    if d.is_Number:
        return bool(d >= 0)
    d = sympy.expand(d.xreplace({v: v + 2 for v in d.free_symbols}))
    return all(t.as_coeff_Mul()[0] >= 0 for t in sympy.Add.make_args(d))


def _fixed(e, spans: dict):
    """e with the vars of one-value spans substituted, or None where that would divide a
    negative value (C++ truncates where sympy floors; such an index is masked off anyway)."""
    fixed = {v: sympy.sympify(lo) for v, (lo, hi) in spans.items() if hi - lo == 1}
    if not fixed or not e.free_symbols & fixed.keys():
        return e
    for f in e.atoms(FloorDiv, ModularIndexing):
        arg = f.args[0].xreplace(fixed)
        if arg.is_Integer and arg < 0:
            return None
    return e.xreplace(fixed)


def bounds(e, ranges: dict, spans: dict):
    """[lo, hi] of an affine e for vars in spans ({var: (lo, hi)}, hi exclusive) or in ranges
    ({var: size}, from 0), or None when e is not affine or a var's range is unknown. Vars of
    one-value spans are substituted first (a div or mod of them is then a number)."""
    e = _fixed(e, spans)
    if e is None:
        return None
    a = affine(e)
    if a is None:
        return None
    lo = hi = a[0]
    for v, c in a[1].items():
        if v in spans:
            vlo, vhi = spans[v][0], spans[v][1] - 1
        elif surely_positive(ranges.get(v, 0)):
            vlo, vhi = 0, ranges[v] - 1
        else:
            return None
        lo, hi = (lo + c * vlo, hi + c * vhi) if c > 0 else (lo + c * vhi, hi + c * vlo)
    return lo, hi


def decide(cmp: str, lo, hi, k) -> bool | None:
    """`x cmp k` for every x in [lo, hi]: True, False, or None when it depends on x. With
    dynamic shapes lo, hi and k may be size expressions: decided only where surely_le proves it."""
    if isinstance(k, bool) or not isinstance(k, (int, float, sympy.Basic)) or \
            isinstance(k, sympy.Basic) and not is_size(k):
        return None
    if isinstance(k, float) or not any(map(is_symbolic, (lo, hi, k))):
        table = {"lt": (hi < k, lo >= k), "le": (hi <= k, lo > k), "gt": (lo > k, hi <= k),
                 "ge": (lo >= k, hi < k), "eq": (lo == hi == k, k < lo or k > hi),
                 "ne": (k < lo or k > hi, lo == hi == k)}
    else:           # integers: x < k is x + 1 <= k
        le = surely_le
        one = (le(hi, k) and le(k, lo), le(k + 1, lo) or le(hi + 1, k))
        table = {"lt": (le(hi + 1, k), le(k, lo)), "le": (le(hi, k), le(k + 1, lo)),
                 "gt": (le(k + 1, lo), le(hi, k)), "ge": (le(k, lo), le(hi + 1, k)),
                 "eq": one, "ne": one[::-1]}
    always, never = table[cmp]
    return True if always else (False if never else None)


class SplitPoints(OpsHandler):
    """Runs a body and collects, for each loop var in `sizes` ({var: size}), the values in
    (0, size) where a compare of an index `c*var + c0` (integers c, c0; with `unit`, c = +-1)
    with a constant changes value."""

    def __init__(self, sizes: dict, ranges: dict, subs: dict, unit: bool = False):
        self.sizes, self.ranges, self.subs, self.unit = sizes, ranges, subs, unit
        self.points: dict = {v: set() for v in sizes}

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
        k = b[1] if isinstance(b, tuple) and b[0] in ("c", "idx") else b
        k = int(k) if isinstance(k, sympy.Integer) else k
        if isinstance(k, bool) or not isinstance(k, (int, sympy.Basic)) or \
                isinstance(k, sympy.Basic) and not is_size(k):
            return None             # (a size expression: a cat at a dynamic size)
        form = affine(a[1])
        if form is None:
            # a div or mod of one short loop var (a flattened stack's pair index): split it
            # into single values, which later copies substitute (see unswitch)
            (var, *more) = a[1].free_symbols or (None,)
            n = self.sizes.get(var)
            if not more and not self.unit and isinstance(n, int) and n <= MAX_SEGMENTS:
                self.points[var].update(range(1, n))
            return None
        if len(form[1]) != 1:
            return None
        (var, c), = form[1].items()
        c0 = form[0]
        if var not in self.sizes or (self.unit and c not in (1, -1)) or \
                c not in (1, -1) and any(map(is_symbolic, (k, c0, self.sizes[var]))):
            return None
        # `c*var + c0 cmp k` is monotone in var: it changes value where `c*var + c0 >= K`
        # starts (c > 0) or stops (c < 0) holding, K = k (lt, ge) or k + 1 (le, gt); eq and ne
        # change around the one var value with c*var + c0 == k, if there is one
        if name in ("eq", "ne"):
            pts = [(k - c0) // c, (k - c0) // c + 1] if (k - c0) % c == 0 else []
        else:
            big = k + 1 if name in ("le", "gt") else k
            pts = [-((c0 - big) // c)] if c > 0 else [(c0 - big) // -c + 1]
        n = self.sizes[var]
        self.points[var].update(sympy.expand(p) if is_symbolic(p) else int(p) for p in pts
                                if surely_le(1, p) and surely_le(p + 1, n))
        return None


def _segments(points: set, size) -> list[tuple] | None:
    """The segments between `points` of a loop over [0, size); points and size may be size
    expressions (dynamic shapes): ordered by their hints, and None unless each one is surely
    below the next (a segment's bounds must hold for every size)."""
    if not points or len(points) >= MAX_SEGMENTS:
        return None
    edges = [0] + sorted(points, key=hint) + [size]
    if any(map(is_symbolic, edges)) and \
            not all(surely_le(a + 1, b) for a, b in zip(edges[:-1], edges[1:])):
        return None
    return list(zip(edges[:-1], edges[1:]))


def split_points(store_fn, var, size, ranges: dict, subs: dict) -> list[tuple[int, int]] | None:
    """Segments [(lo, hi)] of the innermost loop (var over `size`) between which the body's
    index compares change value, or None when there are none (or too many). Only compares of
    `var + c` or `-var + c`: a strided window's loads are gathers in the simd loop either way."""
    h = SplitPoints({var: size}, ranges, subs, unit=True)
    with set_handler(h):
        store_fn()
    return _segments(h.points[var], size)


def unswitch(store_fn, sizes: dict, ranges: dict, subs: dict) -> list[dict] | None:
    """The combinations of segments of the loops in `sizes` ({var: size}, outer loops; sizes
    may be symbolic) between which the body's index compares change value: a list of
    {var: (lo, hi)}, one per copy of the loop nest to emit, or None when no compare is on them.
    At most MAX_UNSWITCH copies: dims are taken fewest segments first while the count fits.
    A segment of one value fixes its var, and a copy that fixes a new var is looked at again
    with it substituted: a compare of `2*a + b` (a stack's pairs, flattened) is on `a` alone
    once `b` is fixed (dims left out for the bound stay out)."""
    done, todo = [], [({}, True, set())]
    while todo:
        c, look, skip = todo.pop(0)
        fixed = {v: sympy.sympify(lo) for v, (lo, hi) in c.items() if hi - lo == 1}
        if not look:
            done.append(c)
            continue
        h = SplitPoints({v: n if is_symbolic(n) else int(n) for v, n in sizes.items()
                         if v not in c and v not in skip},
                        ranges, {**subs, **fixed})
        with set_handler(h):
            store_fn()
        split = [(v, seg) for v in h.sizes if (seg := _segments(h.points[v], h.sizes[v]))]
        kids = [c]
        for v, seg in sorted(split, key=lambda vs: len(vs[1])):
            if len(done) + len(todo) + len(kids) * len(seg) > MAX_UNSWITCH:
                skip = skip | {v}
                continue
            kids = [{**k, v: s} for k in kids for s in seg]
        todo += [(k, k is not c and sum(hi - lo == 1 for lo, hi in k.values()) > len(fixed),
                  skip) for k in kids]
    if done == [{}]:
        return None
    order = list(sizes)
    return sorted(done, key=lambda c: [c.get(v, (0, 0)) for v in order])


def segment(sizes, xv, spans: dict):
    """One copy of a loop nest over `sizes` (vars xv) restricted to `spans` ({var: (lo, hi)}):
    (its sizes, its loop vars, the original vars as expressions of them). A var of a spanned
    dim counts from the segment's start (v stands for lo + v); a one-value segment is no loop,
    its var the constant lo."""
    out_sizes, out_vars, point = [], [], []
    for v, n in zip(xv, sizes):
        lo, hi = spans.get(v, (0, n))
        if hi - lo == 1 and v in spans:
            point.append(sympy.sympify(lo))
            continue
        out_sizes.append(hi - lo)
        out_vars.append(v)
        point.append(v + lo)
    return out_sizes, out_vars, point
