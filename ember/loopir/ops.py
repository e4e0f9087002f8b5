"""The loop IR's op vocabulary, shared by lower, schedule and every codegen.

A loop-IR body is a Python function `inner_fn(index)` that calls `ops.<name>(...)`. Which handler
answers is chosen by `with set_handler(h):` (one ContextVar, this module only), so running the
same body under different handlers gives dependencies (schedule.deps), op counts (lower's
realize heuristics, `CountHandler` here), printed Python (loopir.printer) or C++ / Triton source
(codegen). Every op a body may call is declared here (`OPS`); `ops.<name>` of any other name
raises AttributeError at once, and an analysis handler subclasses `OpsHandler`, overriding
`default` (the answer for every op it does not handle specially), so no handler accepts a
misspelled op.

Consumes: nothing. Produces: `ops`, `set_handler`, `OpsHandler`, `CountHandler`, op name tables,
`compute_dtype`.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import sympy
import torch

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

#: The ops that are not pointwise math: memory, constants, indices, casts, select, masking.
SPECIAL = ("load", "store", "constant", "index_expr", "to_dtype", "where", "masked",
           "indirect_indexing")
#: Every op a loop-IR body may call.
OPS = frozenset(UNARY + BINARY + SPECIAL)

_handler: contextvars.ContextVar = contextvars.ContextVar("ember_ops_handler")


@contextlib.contextmanager
def set_handler(handler):
    token = _handler.set(handler)
    try:
        yield handler
    finally:
        _handler.reset(token)


class _Ops:
    """`ops.exp(x)` forwards to the current handler's `exp`; a name not in `OPS` raises."""

    def __getattr__(self, name: str) -> Callable:
        if name not in OPS:
            raise AttributeError(f"ops.{name} is not a loop-IR op (see OPS in ember/loopir/ops.py)")

        def call(*args, **kwargs):
            return getattr(_handler.get(), name)(*args, **kwargs)
        call.__name__ = name
        return call


ops = _Ops()


class OpsHandler:
    """Base of the analysis handlers: one method per op in `OPS`, each answering
    `self.default(name, *args, **kwargs)`. A subclass overrides `default` and the ops it treats
    specially; an op name that is not declared has no method, so it raises AttributeError."""

    def default(self, name: str, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not handle ops.{name}")


def _declare(name: str) -> None:
    def op(self, *args, **kwargs):
        return self.default(name, *args, **kwargs)
    op.__name__ = op.__qualname__ = name
    setattr(OpsHandler, name, op)


for _name in sorted(OPS):
    _declare(_name)


# ops whose recomputation costs more than re-reading a row-local value (realize heuristics)
TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "erf",
                            "erfc", "sigmoid", "pow", "sin", "cos", "tan", "asin", "acos", "atan",
                            "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma"})


class CountHandler(OpsHandler):
    """Counts loads and ops of a body (the realize heuristics read these).

    `full_loads` counts the loads whose index uses every var in `dims` (the body's loop vars of
    extent > 1): a load that skips one (a per-row mean, a bias) is a broadcast, re-read from cache
    when a user recomputes the body, so it costs no memory traffic."""

    def __init__(self, dims=()):
        self.loads = 0
        self.full_loads = 0
        self.ops = 0
        self.transcendental = 0
        self.constants = 0          # of `ops`: literals, which cost no compute
        self.gathers = 0            # indirect (data-dependent) indices
        self.indices: list = []     # every load's index
        self.names: set[str] = set()
        self.full_names: set[str] = set()   # buffers of the full loads
        self.dims = frozenset(dims)

    def load(self, name, index):
        self.loads += 1
        self.indices.append(index)
        free = getattr(index, "free_symbols", frozenset())
        full = self.dims <= free
        self.full_loads += full
        self.names.add(name)
        if full:
            self.full_names.add(name)
        return None

    def store(self, name, index, value):
        return None

    def masked(self, mask, body, other):
        self.ops += 1
        return body()

    def indirect_indexing(self, value, size, check=True):
        self.ops += 1
        self.gathers += 1
        return sympy.Integer(0)

    def default(self, name, *args, **kwargs):
        self.ops += 1
        self.transcendental += name in TRANSCENDENTAL
        self.constants += name == "constant"
        return None


def count_body(fn: Callable, *args, dims=()) -> CountHandler:
    h = CountHandler(dims)
    with set_handler(h):
        fn(*args)
    return h


LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: fp16/bf16 are computed (and accumulated) in fp32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype
