"""The loop IR's index algebra: sympy expressions over loop variables and size symbols.

Indices are sympy expressions; `FloorDiv` and `ModularIndexing` are the only non-polynomial index
functions, and `simplify_index` rewrites them with the loop ranges. Sizes may be symbols
(dynamic shapes) named `s0, s1, ...`: `SIZE_NAME` is the one definition of that name, used by the
kernels' parameter lists, the wrappers and the runtime's argument types.

Consumes: nothing. Produces: index functions and helpers, `size_hints`/`hint`.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re

import sympy

class FloorDiv(sympy.Function):
    """a // b on non-negative integers (printed as C division)."""
    is_integer = True
    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):  # (x // p) // q == x // (p*q)
            return FloorDiv(a.args[0], a.args[1] * b)
        if a.is_Add:  # pull out terms that are multiples of b
            keep, out = [], []
            for t in a.args:
                c, rest = t.as_coeff_Mul()
                if c.is_Integer and b.is_Integer and int(c) % int(b) == 0:
                    out.append(sympy.Integer(int(c) // int(b)) * rest)
                else:
                    keep.append(t)
            if out and keep and _all_nonneg(keep):
                return sympy.Add(*out) + FloorDiv(sympy.Add(*keep), b)
        if a.is_Mul:
            c, rest = a.as_coeff_Mul()
            if c.is_Integer and b.is_Integer and int(c) % int(b) == 0:
                return sympy.Integer(int(c) // int(b)) * rest
        return None


class ModularIndexing(sympy.Function):
    """(a // b) % m on non-negative integers."""
    is_integer = True
    nargs = 3

    @classmethod
    def eval(cls, a, b, m):
        if m == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer and m.is_Integer:
            return sympy.Integer((int(a) // int(b)) % int(m))
        if b == 1 and a.is_Add and m.is_Integer:  # drop terms that are multiples of m
            keep = []
            for t in a.args:
                c, rest = t.as_coeff_Mul()
                if not (c.is_Integer and int(c) % int(m) == 0):
                    keep.append(t)
            if len(keep) < len(a.args) and _all_nonneg(keep):
                return ModularIndexing(sympy.Add(*keep), b, m)
        return None


def simplify_index(expr, ranges: dict):
    """Rewrite the FloorDiv/ModularIndexing in an index expression using the loop variables'
    ranges (`{var: size}`; a var not in it, or a symbolic size, is unbounded), so that a load
    through a view of a view becomes affine again. A reshape's index `80*((v//80) % 80) +
    6400*(v//6400) + v % 80` is `v` for 0 <= v < 25600; left as it is, the kernel divides three
    times per element and cannot vectorize the load. Rules (all on non-negative terms):
      - x // b -> 0, and (x // b) % m -> x // b, when x < b, resp. x < b*m;
      - (g*y + r) // b -> y // (b/g) and ((g*y + r) // b) % m -> (y // (b/g)) % m, when g
        divides b and 0 <= r < g;
      - ((b*m*k + r) // b) % m -> (r // b) % m, and (g*y + r) % (g*k) -> g*(y % k) + r when
        0 <= r < g;
      - joins: c*((x//b) % m) + c*m*((x//(b*m)) % n) -> c*((x//b) % (m*n)), and
        c*((x//b) % m) + c*m*(x // (b*m)) -> c*(x // b).
    """
    if not isinstance(expr, sympy.Basic) or not expr.has(FloorDiv, ModularIndexing):
        return expr
    key = tuple(sorted(((str(v), v, n) for v, n in ranges.items() if expr.has(v)),
                       key=lambda t: t[0]))
    return _simplify_index(expr, tuple((v, n) for _, v, n in key))


@functools.lru_cache(4096)
def _simplify_index(expr, ranges: tuple):
    bounds = {v: int(n) - 1 for v, n in ranges if isinstance(n, int) or
              isinstance(n, sympy.Integer)}
    e = _simplify(expr, bounds)
    if any(is_symbolic(n) for _, n in ranges) or any(
            is_symbolic(a) for f in e.atoms(FloorDiv, ModularIndexing) for a in f.args[1:]):
        e = _symbolic(e, {v: sympy.sympify(n) - 1 for v, n in ranges})
    return e


def _upper(e, bounds):
    """The largest value of a non-negative index expression, or None when unknown."""
    if e.is_Integer:
        return int(e) if e >= 0 else None
    if e.is_Symbol:
        return bounds.get(e)
    if e.is_Add:
        total = 0
        for t in e.args:
            u = _upper(t, bounds)
            if u is None:
                return None
            total += u
        return total
    if e.is_Mul:
        # a product of non-negative factors (as_coeff_Mul gives (1, e) for x*y: recursing on
        # `rest` would not terminate)
        total = 1
        for f in e.args:
            u = _upper(f, bounds)
            if u is None:
                return None
            total *= u
        return total
    if isinstance(e, FloorDiv) and e.args[1].is_Integer:
        u = _upper(e.args[0], bounds)
        return None if u is None else u // int(e.args[1])
    if isinstance(e, ModularIndexing) and e.args[1].is_Integer and e.args[2].is_Integer:
        u = _upper(e.args[0], bounds)
        m = int(e.args[2]) - 1
        return m if u is None else min(m, u // int(e.args[1]))
    return None


def _terms(a):
    """[(int coefficient, rest)] of a sum of non-negative terms, or None if one is not."""
    out = []
    for t in sympy.Add.make_args(a):
        c, rest = t.as_coeff_Mul()
        if not c.is_Integer or c < 0 or not (rest.is_nonnegative or rest == 1):
            return None
        out.append((int(c), rest))
    return out


def _factor_out(a, b: int, bounds):
    """(y, g): a == g*y + r with g > 1 dividing b and 0 <= r < g (the largest such g), else
    None. Then a // b == y // (b/g)."""
    terms = _terms(a)
    if terms is None:
        return None
    for g in sorted({math.gcd(c, b) for c, _ in terms if c}, reverse=True):
        if g <= 1:
            break
        big = [(c, t) for c, t in terms if c % g == 0]
        small = sympy.Add(*[c * t for c, t in terms if c % g])
        u = _upper(small, bounds)
        if big and u is not None and u < g:
            return sympy.Add(*[(c // g) * t for c, t in big]), g
    return None


def _simplify(e, bounds):
    if not e.args or not e.has(FloorDiv, ModularIndexing):
        return e
    if e.is_Add:      # join first: simplifying the parts may make them stop matching
        joined = _join(e)
        if joined is not None:
            return _simplify(joined, bounds)
    e = e.func(*[_simplify(a, bounds) for a in e.args])
    if isinstance(e, FloorDiv) and e.args[1].is_Integer:
        a, b = e.args[0], int(e.args[1])
        u = _upper(a, bounds)
        if u is not None and u < b:
            return sympy.Integer(0)
        f = _factor_out(a, b, bounds)
        if f is not None:
            return _simplify(FloorDiv(f[0], sympy.Integer(b // f[1])), bounds)
        return e
    if isinstance(e, ModularIndexing) and e.args[1].is_Integer and e.args[2].is_Integer:
        a, b, m = e.args[0], int(e.args[1]), int(e.args[2])
        if b * m == 0:      # a view of a dim of size 0: no element is ever read
            return e
        terms = _terms(a)
        if terms is not None and any(c % (b * m) == 0 and c for c, _ in terms):
            rest = sympy.Add(*[c * t for c, t in terms if not (c and c % (b * m) == 0)])
            return _simplify(ModularIndexing(rest, sympy.Integer(b), sympy.Integer(m)), bounds)
        u = _upper(a, bounds)
        if u is not None and u < b * m:
            return _simplify(FloorDiv(a, sympy.Integer(b)), bounds)
        f = _factor_out(a, b, bounds)
        if f is not None:
            return _simplify(ModularIndexing(f[0], sympy.Integer(b // f[1]), sympy.Integer(m)),
                             bounds)
        f = _factor_out(a, m, bounds) if b == 1 else None
        if f is not None:     # (g*y + r) % (g*k) == g*(y % k) + r
            y, g = f
            return _simplify(g * ModularIndexing(y, sympy.Integer(1), sympy.Integer(m // g)) +
                             (a - g * y).expand(), bounds)
        return e
    if e.is_Add:
        joined = _join(e)
        if joined is not None:
            return _simplify(joined, bounds)
    return e


# --- symbolic divisors (dynamic shapes, docs/design/054) ------------------------------------
# A dynamic graph's views divide by size symbols: a head merge reads `v // s2` and `v % s2`, a
# flattened index `(v3 + v2*s3 + v1*s2*s3) // s3`. The rules above need integer divisors; these
# are the same rules over monomials of size symbols, each proved with `_le`: an upper bound of
# the remainder as a polynomial in the sizes, all of which are non-negative.

def _size_expr(e) -> bool:
    """An expression of size symbols only with no negative term (s0, 4*s1, s1 // 4): a
    non-negative run-time constant."""
    return bool(e.free_symbols) and all(SIZE_NAME.fullmatch(x.name) for x in e.free_symbols) \
        and all(t.as_coeff_Mul()[0] >= 0 for t in sympy.Add.make_args(sympy.expand(e)))


def _supper(e, bounds):
    """A polynomial upper bound of a non-negative index expression over the loop vars' symbolic
    `bounds` ({var: size - 1}), or None when unknown."""
    if e.is_Integer:
        return e if e >= 0 else None
    if e.is_Symbol:
        return bounds.get(e, e if SIZE_NAME.fullmatch(e.name) else None)
    if _size_expr(e):
        return e
    if e.is_Add or e.is_Mul:
        parts = [_supper(a, bounds) for a in e.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*parts) if e.is_Add else sympy.Mul(*parts)
    if isinstance(e, FloorDiv):     # x // b <= x
        return _supper(e.args[0], bounds)
    if isinstance(e, ModularIndexing):
        return e.args[2] - 1
    return None


def _le(a, b) -> bool:
    """a <= b for all non-negative values of the size symbols: b - a expands to a sum of terms
    with non-negative coefficients (sufficient, not necessary)."""
    d = sympy.expand(b - a)
    return all(t.as_coeff_Mul()[0] >= 0 for t in sympy.Add.make_args(d))


def _divides(t, b):
    """t / b when it is a monomial with an integer coefficient (b divides t), else None."""
    q = t / b
    n, d = q.as_numer_denom()
    return q if d == 1 and q.as_coeff_Mul()[0].is_Integer else None


def _sym_factor(a, b, bounds):
    """(y, g): a == g*y + r with g a common factor of b and some terms of a, 0 <= r < g, else
    None (the symbolic _factor_out). g == b pulls whole multiples out of a // b."""
    terms = list(sympy.Add.make_args(a))
    if any(t.as_coeff_Mul()[0] < 0 for t in terms):
        return None
    for g in dict.fromkeys(sympy.gcd(t, b) for t in terms):
        if g == 1:
            continue
        big = [q for q in (_divides(t, g) for t in terms) if q is not None]
        small = sympy.Add(*[t for t in terms if _divides(t, g) is None])
        u = _supper(small, bounds)
        if big and u is not None and _le(u + 1, g):
            return sympy.Add(*big), g
    return None


def _symbolic(e, bounds):
    """FloorDiv/ModularIndexing of `e` with symbolic divisors or symbolic loop bounds, rewritten
    by the rules of simplify_index (x // b -> 0 when x < b; factoring g out of g*y + r)."""
    if not e.args or not e.has(FloorDiv, ModularIndexing):
        return e
    e = e.func(*[_symbolic(a, bounds) for a in e.args])
    if isinstance(e, FloorDiv):
        a, b = e.args
        u = _supper(a, bounds)
        if u is not None and _le(u + 1, b):
            return sympy.Integer(0)
        f = _sym_factor(a, b, bounds)
        if f is not None:
            return _symbolic(FloorDiv(f[0], sympy.cancel(b / f[1])), bounds)
    elif isinstance(e, ModularIndexing):
        a, b, m = e.args
        terms = sympy.Add.make_args(a)
        keep = [t for t in terms if _divides(t, b * m) is None]
        if len(keep) < len(terms) and all(t.as_coeff_Mul()[0] >= 0 for t in terms):
            return _symbolic(ModularIndexing(sympy.Add(*keep), b, m), bounds)
        u = _supper(a, bounds)
        if u is not None and _le(u + 1, b * m):
            return _symbolic(FloorDiv(a, b), bounds)
        f = _sym_factor(a, b, bounds)
        if f is not None:
            return _symbolic(ModularIndexing(f[0], sympy.cancel(b / f[1]), m), bounds)
        f = _sym_factor(a, m, bounds) if b == 1 else None
        if f is not None:     # (g*y + r) % (g*k) == g*(y % k) + r
            y, g = f
            return _symbolic(g * ModularIndexing(y, sympy.Integer(1), sympy.cancel(m / g)) +
                             sympy.expand(a - g * y), bounds)
    return e


def _join(e):
    """One join of two terms of the sum `e` (see simplify_index), or None."""
    parts = []
    for t in e.args:
        c, f = t.as_coeff_Mul()
        if c.is_Integer and isinstance(f, (FloorDiv, ModularIndexing)) and f.args[1].is_Integer:
            parts.append((t, int(c), f))
    for t1, c, f in parts:
        if not isinstance(f, ModularIndexing) or not f.args[2].is_Integer:
            continue
        x, b, m = f.args[0], int(f.args[1]), int(f.args[2])
        for t2, c2, f2 in parts:
            if t2 is t1 or c2 != c * m or f2.args[0] != x or int(f2.args[1]) != b * m:
                continue
            if isinstance(f2, FloorDiv):
                new = c * FloorDiv(x, sympy.Integer(b))
            elif f2.args[2].is_Integer:
                new = c * ModularIndexing(x, sympy.Integer(b), sympy.Integer(m * int(f2.args[2])))
            else:
                continue
            return e - t1 - t2 + new
    return None


def _all_nonneg(terms) -> bool:
    return all(t.is_nonnegative for t in terms)


def sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def contiguous_strides(size) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * (s if isinstance(s, sympy.Basic) and s.free_symbols else max(int(s), 1))
    return tuple(reversed(strides))


def numel(size) -> int:
    """Product of sizes: an int, or a sympy expression when a size is symbolic."""
    n = 1
    for s in size:
        n = n * (s if isinstance(s, sympy.Basic) and s.free_symbols else int(s))
    return n


# --- dynamic shapes: sizes are sympy expressions over s0, s1, ... ----------------------------
#: size symbols are kernel parameters named like this (C++, Triton, wrappers, runtime)
SIZE_NAME = re.compile(r"\bs\d+\b")
#: the symbols' values at trace time, for heuristics (parallelize? vectorize?) only
_HINTS: contextvars.ContextVar = contextvars.ContextVar("ember_size_hints", default={})


@contextlib.contextmanager
def size_hints(hints: dict):
    token = _HINTS.set(hints)
    try:
        yield
    finally:
        _HINTS.reset(token)


def hint(x) -> int:
    """A size's value at trace time: for choosing how to generate code, never for its meaning."""
    if isinstance(x, sympy.Basic):
        if x.free_symbols:
            return int(x.xreplace(_HINTS.get()))
        return int(x)
    return int(x)


def is_symbolic(x) -> bool:
    return isinstance(x, sympy.Basic) and bool(x.free_symbols)


def surely_positive(n) -> bool:
    """Whether a loop of `n` iterations surely runs: an integer > 0, or a sum of products of size
    symbols with positive coefficients (every size symbol is >= 2: sizes 0 and 1 specialize,
    shapes.py). `s0 // 4` or `s0 - 2` may be 0."""
    if not is_symbolic(n):
        return int(n) > 0
    return all(t.as_coeff_Mul()[0] > 0 and all(f.is_Symbol or f.is_Pow and f.base.is_Symbol
                                               for f in sympy.Mul.make_args(t.as_coeff_Mul()[1]))
               for t in sympy.Add.make_args(sympy.expand(n)))


def strided_index(index, stride, offset=0):
    expr = sympy.sympify(offset)
    for i, s in zip(index, stride):
        if s != 0:
            expr = expr + i * s
    return expr
