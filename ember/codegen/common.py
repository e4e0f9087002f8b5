"""Shared by lower, schedule and every codegen: the device-neutral `ops` handler protocol.

A loop-IR body is a Python function `inner_fn(index)` that calls `ops.<name>(...)`. Which handler
answers is chosen by `with set_handler(h):` (one ContextVar, this module only), so running the
same body under different handlers gives dependencies (schedule.deps), op counts (lower's
realize heuristics) or C++ / Triton source (codegen). Indices are sympy expressions over loop
variables; `FloorDiv` and `ModularIndexing` are the only non-polynomial index functions.

Consumes: nothing. Produces: `ops`, `set_handler`, index helpers, dtype tables, `IndentedBuffer`.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from typing import Any, Callable

import sympy
import torch

# --- the ops handler -----------------------------------------------------------------------

#: Ops every handler understands. Pointwise math ops take/return handler values; the special
#: ones are load/store/constant/index_expr/to_dtype/where/masked.
UNARY = ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
         "atanh", "sigmoid", "erf", "erfc", "reciprocal", "relu", "floor", "ceil", "round",
         "trunc", "sign", "signbit", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not",
         "lgamma", "square")
BINARY = ("add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod", "pow",
          "maximum", "minimum", "atan2", "hypot", "copysign", "nextafter",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift")
COMPARE = frozenset(("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                     "logical_xor", "logical_not", "isnan", "isinf", "isfinite", "signbit"))

_handler: contextvars.ContextVar = contextvars.ContextVar("ember_ops_handler")


@contextlib.contextmanager
def set_handler(handler):
    token = _handler.set(handler)
    try:
        yield handler
    finally:
        _handler.reset(token)


class _Ops:
    """`ops.exp(x)` forwards to the current handler's `exp`."""

    def __getattr__(self, name: str) -> Callable:
        def call(*args, **kwargs):
            return getattr(_handler.get(), name)(*args, **kwargs)
        call.__name__ = name
        return call


ops = _Ops()


class CountHandler:
    """Counts loads and ops of a body (the realize heuristics read these)."""

    def __init__(self):
        self.loads = 0
        self.ops = 0
        self.names: set[str] = set()

    def load(self, name, index):
        self.loads += 1
        self.names.add(name)
        return None

    def store(self, name, index, value):
        return None

    def masked(self, mask, body, other):
        self.ops += 1
        return body()

    def indirect_indexing(self, value, size, check=True):
        self.ops += 1
        return sympy.Integer(0)

    def __getattr__(self, name):
        def op(*args, **kwargs):
            self.ops += 1
            return None
        return op


def count_body(fn: Callable, *args) -> CountHandler:
    h = CountHandler()
    with set_handler(h):
        fn(*args)
    return h


# --- sympy index helpers -------------------------------------------------------------------

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


def index_printer(div: str, integer: Callable[[int], str] = str) -> Callable[[Any], str]:
    """A printer of sympy index expressions for one target: C++ divides with "/", Triton with
    "//" (indices are non-negative, so both floor). `integer` formats literals (C++ adds LL)."""
    def pr(e) -> str:
        if isinstance(e, int):
            return integer(e)
        if e.is_Integer:
            return integer(int(e))
        if e.is_Symbol:
            return e.name
        if isinstance(e, FloorDiv):
            return f"({pr(e.args[0])} {div} {pr(e.args[1])})"
        if isinstance(e, ModularIndexing):
            a, b, m = e.args
            inner = pr(a) if b == 1 else f"({pr(a)} {div} {pr(b)})"
            return f"({inner} % {pr(m)})"
        if e.is_Add:
            return "(" + " + ".join(pr(t) for t in e.args) + ")"
        if e.is_Mul:
            return "(" + " * ".join(pr(t) for t in e.args) + ")"
        if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
            return "(" + " * ".join([pr(e.args[0])] * int(e.args[1])) + ")"
        if isinstance(e, sympy.floor):     # a size from shape arithmetic: floor(a / b)
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return f"({pr(num)} {div} {pr(den)})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            f = "std::max<int64_t>" if div == "/" else ("max" if isinstance(e, sympy.Max) else "min")
            if div == "/" and isinstance(e, sympy.Min):
                f = "std::min<int64_t>"
            out = pr(e.args[0])
            for a in e.args[1:]:
                out = f"{f}({out}, {pr(a)})"
            return out
        raise NotImplementedError(f"index expression {e}")
    return pr


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
#: size symbols are kernel parameters named like this (C++ and Triton)
SIZE_PARAM = re.compile(r"\bs\d+\b")
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


def strided_index(index, stride, offset=0):
    expr = sympy.sympify(offset)
    for i, s in zip(index, stride):
        if s != 0:
            expr = expr + i * s
    return expr


# --- dtypes --------------------------------------------------------------------------------

CTYPE = {
    torch.float32: "float", torch.float64: "double", torch.float16: "ember_half",
    torch.bfloat16: "ember_bf16", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: fp16/bf16 are computed (and accumulated) in fp32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def is_float(dtype) -> bool:
    return dtype.is_floating_point


# --- text ----------------------------------------------------------------------------------

class IndentedBuffer:
    def __init__(self, indent: int = 0):
        self.lines: list[str] = []
        self.level = indent

    def writeline(self, line: str) -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def writelines(self, lines) -> None:
        for line in lines:
            self.writeline(line)

    @contextlib.contextmanager
    def indent(self, n: int = 1):
        self.level += n
        try:
            yield
        finally:
            self.level -= n

    def getvalue(self) -> str:
        return "\n".join(self.lines) + "\n"


def py_repr(value: Any) -> str:
    """repr() that round-trips torch dtypes/devices/layouts/memory formats in generated Python."""
    if isinstance(value, torch.dtype):
        return f"torch.{str(value).split('.')[-1]}"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.layout, torch.memory_format)):
        return f"torch.{str(value).split('.')[-1]}"
    if isinstance(value, float):
        if value != value:
            return "float('nan')"
        if value in (float("inf"), float("-inf")):
            return f"float({str(value)!r})"
    if isinstance(value, sympy.Basic):
        from ..shapes import pyexpr
        return pyexpr(value, str)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(py_repr(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    return repr(value)
