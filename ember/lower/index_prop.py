"""Stage 4, lower: index tensors that are exact functions of the loop variables become direct
indices.

Decompositions compute some index tensors from `arange` with float math, e.g. nearest upsampling
(`min(int64(float(i) * 0.5), 55)`). Lowered as a gather, each output element converts int -> float
-> int64 and loads through a data-dependent index: g++ cannot vectorize that loop on AVX2 (no
vector float -> int64 conversion, no gather it can prove in bounds), so the kernel ran scalar,
2-10x slower than eager. When the index body is such a function, `static_index` evaluates it
symbolically (`i // 2`), and the load uses that affine/`FloorDiv` index, which the codegen
simplifies with the loop ranges and vectorizes like any strided load.

Only exact rewrites: the body may use index_expr, constants, add/sub/neg/mul/truediv, integer
floordiv/truncdiv/remainder by a positive constant, min/max that the ranges decide, and casts.
Every intermediate value is checked, over the index's ranges, to be exactly representable in its
dtype (float32: multiples of 1/2^k below 2^24 in magnitude; int32/int64: no overflow), so the
float ops in eager compute exactly the rational value tracked here; a float -> int cast is taken
only where the value is >= 0 (truncation = floor). The result must lie in [0, size) for every
index in range, which makes the bounds check / negative wrap of the gather unnecessary. Anything
else (a load, a where, an unproven min) leaves the gather as it is.

`window_preimage` inverts such an index along one dim when each target position receives a
window of consecutive sources starting at a*x + c (nearest upsampling by an integer factor): an
accumulating index_put through it (nearest's backward) is then a gather-sum per output element.

Consumes: an index loader (a loop-IR body), its sizes. Produces: a sympy index or None.
"""
from __future__ import annotations

import math
from fractions import Fraction

import sympy
import torch

from ..loopir.index import FloorDiv, ModularIndexing, is_symbolic
from ..loopir.ops import OpsHandler, set_handler

#: |value| below which every multiple of 1/2^k (k small) is exact, per dtype (mantissa bits),
#: and the integer ranges.
_EXACT = {torch.float32: 2 ** 24, torch.float64: 2 ** 53, torch.int32: 2 ** 31 - 1,
          torch.int64: 2 ** 63 - 1}


class _Give(Exception):
    """The body is not an exact function of the index (the gather stays)."""


class _Val:
    __slots__ = ("expr", "dtype")

    def __init__(self, expr, dtype):
        self.expr, self.dtype = expr, dtype


def _bounds(e, ranges) -> tuple[Fraction, Fraction]:
    """Interval of a polynomial/FloorDiv/ModularIndexing expression over the ranges."""
    if e.is_Integer or e.is_Rational:
        v = Fraction(int(e.p), int(e.q))
        return v, v
    if e.is_Symbol:
        if e not in ranges:
            raise _Give
        return Fraction(0), Fraction(ranges[e] - 1)
    if e.is_Add or e.is_Mul:
        parts = [_bounds(a, ranges) for a in e.args]
        lo, hi = parts[0]
        for a, b in parts[1:]:
            if e.is_Add:
                lo, hi = lo + a, hi + b
            else:
                c = (lo * a, lo * b, hi * a, hi * b)
                lo, hi = min(c), max(c)
        return lo, hi
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return _bounds(sympy.Mul(*([e.base] * int(e.exp)), evaluate=False), ranges)
    if isinstance(e, FloorDiv):
        lo, hi = _bounds(e.args[0], ranges)
        d = int(e.args[1])
        return Fraction(math.floor(lo / d)), Fraction(math.floor(hi / d))
    if isinstance(e, ModularIndexing):
        return Fraction(0), Fraction(int(e.args[2]) - 1)
    raise _Give


class _Symbolic(OpsHandler):
    def __init__(self, ranges):
        self.ranges = ranges

    def check(self, expr, dtype) -> _Val:
        """The value, after proving it exact in `dtype` over the ranges."""
        limit = _EXACT.get(dtype)
        if limit is None:
            raise _Give
        expr = sympy.expand(expr)
        lo, hi = _bounds(expr, self.ranges)
        denom = math.lcm(*[int(sympy.Rational(c).q) for c in expr.as_coefficients_dict().values()])
        if dtype.is_floating_point:
            if denom & (denom - 1) or max(abs(lo), abs(hi)) * denom >= limit:
                raise _Give
        elif denom != 1 or max(abs(lo), abs(hi)) > limit:
            raise _Give
        return _Val(expr, dtype)

    def default(self, name, *args, **kwargs):
        raise _Give

    def index_expr(self, expr, dtype):
        return self.check(sympy.sympify(expr), dtype)

    def constant(self, value, dtype):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _Give
        if dtype.is_floating_point and torch.tensor(value, dtype=dtype).item() != value:
            raise _Give
        return self.check(sympy.Rational(Fraction(value)), dtype)

    def _same(self, a, b):
        if a.dtype != b.dtype:
            raise _Give
        return a.dtype

    def add(self, a, b):
        return self.check(a.expr + b.expr, self._same(a, b))

    def sub(self, a, b):
        return self.check(a.expr - b.expr, self._same(a, b))

    def mul(self, a, b):
        return self.check(a.expr * b.expr, self._same(a, b))

    def neg(self, a):
        return self.check(-a.expr, a.dtype)

    def truediv(self, a, b):
        dt = self._same(a, b)
        if not dt.is_floating_point or not b.expr.is_Rational or b.expr == 0:
            raise _Give
        return self.check(a.expr / b.expr, dt)

    def _int_div(self, a, b, op):
        dt = self._same(a, b)
        if dt.is_floating_point or not b.expr.is_Integer or int(b.expr) <= 0:
            raise _Give
        if _bounds(a.expr, self.ranges)[0] < 0:
            raise _Give                         # floor vs trunc differ; keep it simple
        return self.check(op(a.expr, b.expr), dt)

    def floordiv(self, a, b):
        return self._int_div(a, b, FloorDiv)

    def truncdiv(self, a, b):
        return self._int_div(a, b, FloorDiv)

    def remainder(self, a, b):
        return self._int_div(a, b, lambda x, m: ModularIndexing(x, sympy.Integer(1), m))

    def _pick(self, a, b, smaller):
        self._same(a, b)
        (alo, ahi), (blo, bhi) = _bounds(a.expr, self.ranges), _bounds(b.expr, self.ranges)
        if ahi <= blo:
            return a if smaller else b
        if bhi <= alo:
            return b if smaller else a
        raise _Give

    def minimum(self, a, b):
        return self._pick(a, b, True)

    def maximum(self, a, b):
        return self._pick(a, b, False)

    def to_dtype(self, a, dtype):
        if a.dtype.is_floating_point and not dtype.is_floating_point:
            lo, _ = _bounds(a.expr, self.ranges)
            if lo < 0:
                raise _Give                     # truncation is floor only for x >= 0
            num, den = sympy.fraction(sympy.together(a.expr))
            return self.check(FloorDiv(sympy.expand(num), den) if den != 1 else a.expr, dtype)
        return self.check(a.expr, dtype)


def static_index(loader, size, bound):
    """The index `loader(index)` computes, as a sympy expression in `index` (a list of loop
    variables over `size`), when it is an exact function of them with values in [0, bound);
    else None. Returns (expr, vars) so a caller substitutes its own index for `vars`."""
    if any(map(is_symbolic, size)) or is_symbolic(bound):
        return None
    syms = [sympy.Symbol(f"q{d}", integer=True, nonnegative=True) for d in range(len(size))]
    ranges = {s: int(n) for s, n in zip(syms, size)}
    h = _Symbolic(ranges)
    try:
        with set_handler(h):
            v = loader(syms)
        if not isinstance(v, _Val) or v.dtype.is_floating_point:
            return None
        lo, hi = _bounds(v.expr, ranges)
    except Exception:   # noqa: BLE001 - a speculative analysis: a body it cannot follow
        return None     # (_Give, or a Python-level use of values it does not model) stays a gather
    if lo < 0 or hi >= int(bound):
        return None
    return v.expr, syms


def window_preimage(expr, sym, n_src, n_dst, max_window=8):
    """For f = expr(sym) on sym in [0, n_src) into [0, n_dst): (a, c, k) such that for every x the
    sources mapping to x are exactly [a*x + c, a*x + c + k) clipped to [0, n_src); else None.
    Checked numerically on every position (sizes are static and small)."""
    if n_src > 4096 or expr.free_symbols - {sym}:
        return None
    f = sympy.lambdify(sym, expr, modules=[{"FloorDiv": lambda a, b: a // b,
                                            "ModularIndexing": lambda a, b, m: (a // b) % m}])
    pre: dict[int, list[int]] = {}
    for q in range(n_src):
        pre.setdefault(int(f(q)), []).append(q)
    if 0 not in pre or 1 not in pre and n_dst > 1:
        return None
    c = pre[0][0]
    a = pre[1][0] - c if n_dst > 1 else 1
    k = max(len(v) for v in pre.values())
    if a < 1 or k > max_window:
        return None
    for x in range(n_dst):
        want = [q for q in range(a * x + c, a * x + c + k) if 0 <= q < n_src]
        if pre.get(x, []) != want:
            return None
    return a, c, k


def constant_value(loader, size):
    """The value of a body that is one constant (a zero fill), as a sympy number, else None."""
    if any(map(is_symbolic, size)):
        return None
    syms = [sympy.Symbol(f"q{d}", integer=True, nonnegative=True) for d in range(len(size))]
    try:
        with set_handler(_Symbolic({s: int(n) for s, n in zip(syms, size)})):
            v = loader(syms)
    except Exception:   # noqa: BLE001 - as in static_index
        return None
    return v.expr if isinstance(v, _Val) and v.expr.is_number else None
