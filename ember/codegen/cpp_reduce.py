"""C++ reductions' accumulators: initial values, update and combine statements, OpenMP
reduction clauses, cascaded (blocked float into double) long sums and the loop spans of their
blocks. Used by cpp.py's row stages and column reductions."""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import hint
from .cpp_handler import _int, cexpr, ctype, literal

def _init(rtype, dt) -> str:
    t = ctype(dt)
    if rtype in ("sum", "any"):
        return literal(0, dt)
    if rtype == "prod":
        return literal(1, dt)
    if rtype in ("max", "argmax"):
        return (f"-std::numeric_limits<{t}>::infinity()" if dt.is_floating_point
                else f"std::numeric_limits<{t}>::lowest()")
    if rtype in ("min", "argmin"):
        return (f"std::numeric_limits<{t}>::infinity()" if dt.is_floating_point
                else f"std::numeric_limits<{t}>::max()")
    raise NotImplementedError(rtype)


#: float32 sums over at least this many elements are cascaded: a float accumulator drifts by
#: ~sqrt(n) ulps over n terms, and over a BatchNorm's 8x112x112 = 100k elements per channel that
#: made ember's activations 20x less accurate than eager's (lraspp, mobilenet v3; ReLU masks flip
#: at that level). A cascaded sum adds CASCADE_BLOCK elements at a time into a float (vector)
#: accumulator that starts from zero, at float SIMD speed, and adds each block's sum into a
#: double: the error is that of ~CASCADE_BLOCK / lanes float additions per lane, plus one
#: rounding to float (ATen's sum does the same with float levels, its BatchNorm statistics
#: accumulate in double). Converting every element to double instead ran 0.67-0.86x as fast.
#: Short rows (softmax, LayerNorm) keep float accumulators, and so do bf16/fp16 results (float is
#: already far finer than what they store).
LONG_SUM = 4096
#: elements per float block of a cascaded sum along a simd loop (8 lanes: 128 terms per lane)
CASCADE_BLOCK = 1024
#: rows per float block of a cascaded column sum (each column is one lane: terms per lane)
CASCADE_ROWS = 128
#: iterations per `omp for` block of a reduction to a scalar that is not cascaded
PARALLEL_BLOCK = 4096


def _cascaded(node, length) -> bool:
    body = node.body
    return (body.reduction_type == "sum" and body.src_dtype == torch.float32
            and body.dtype == torch.float32 and hint(length) >= LONG_SUM)


def _acc_value(acc, adt, dt) -> str:
    return acc if adt == dt else f"static_cast<{ctype(dt)}>({acc})"


class Span:
    """A loop over [lo, hi) of a dim of `size` (one block of a blocked reduction): the loop var
    still lies in [0, size), which is what index simplification and clamping assume."""

    def __init__(self, lo: str, hi: str, size):
        self.lo, self.hi, self.size = lo, hi, size

    def count(self) -> int:
        """Its iterations when lo and hi are numbers (a segment of a split loop), else the
        dim's size (a hint for parallelization, not a bound)."""
        if self.lo.lstrip("-").isdigit() and self.hi.lstrip("-").isdigit():
            return int(self.hi) - int(self.lo)
        return hint(self.size)


def _count(size) -> int:
    """Iterations of a loop over `size` (an int, a size expression or a Span), as a hint."""
    return size.count() if isinstance(size, Span) else hint(size)


def _for(v, size) -> str:
    """The header of a loop over `size` (an int, a size expression or a Span)."""
    lo, hi = (size.lo, size.hi) if isinstance(size, Span) else (0, _int(size))
    return f"for (int64_t {v} = {lo}; {v} < {hi}; ++{v})"


def _block_split(sizes, block: int) -> tuple[int, int]:
    """(i, c): walk the loop nest `sizes` as blocks of about `block` iterations: dims before i
    one by one, dim i in pieces of c, the dims after it (fewer than `block` iterations) whole."""
    inner = 1
    for i in range(len(sizes) - 1, -1, -1):
        s = hint(sizes[i])
        if inner * s >= block:
            return i, -(-block // inner)
        inner *= s
    return 0, max(hint(sizes[0]), 1)


def _update(rtype, acc, v, dt) -> str:
    if rtype == "sum":
        return f"{acc} += {v};"
    if rtype == "prod":
        return f"{acc} *= {v};"
    if rtype == "any":
        return f"{acc} = {acc} || {v};"
    if rtype == "max":
        return f"{acc} = ember::max_nan({acc}, {v});"
    if rtype == "min":
        return f"{acc} = ember::min_nan({acc}, {v});"
    raise NotImplementedError(rtype)


ARG = ("argmax", "argmin")


def _arg_better(rtype, v, acc, dt) -> str:
    """The test that value v replaces the running arg-reduction value acc: strictly better
    (ties keep the first index), and the first NaN wins, as in eager. The common case (not
    better) is one compare: `v > acc || (v != v && acc == acc)` let g++ put the NaN tests first,
    a chain through acc 3.4x slower."""
    cmp = ">" if rtype == "argmax" else "<"
    if not dt.is_floating_point:
        return f"{v} {cmp} {acc}"
    worse = "<=" if rtype == "argmax" else ">="
    return f"!({v} {worse} {acc}) && ({v} {cmp} {acc} || {acc} == {acc})"


def _flat(rv, sizes):
    """The row-major flat index of loop vars rv over `sizes` (an arg reduction's result)."""
    flat, stride = sympy.Integer(0), sympy.Integer(1)
    for r, s in zip(reversed(rv), reversed(sizes)):
        flat, stride = flat + r * stride, stride * s
    return cexpr(flat)


def _combine(rtype, acc, part) -> str:
    return {"sum": f"{acc} += {part};", "prod": f"{acc} *= {part};",
            "any": f"{acc} = {acc} || {part};", "max": f"{acc} = ember::max_nan({acc}, {part});",
            "min": f"{acc} = ember::min_nan({acc}, {part});"}[rtype]


SIMD_RED = {"sum": "+", "prod": "*", "any": "||"}
UDR = {"max": "emax", "min": "emin"}


def _red_clause(rtypes_accs) -> str:
    parts = []
    for rtype, acc, dt in rtypes_accs:
        if rtype in SIMD_RED:
            parts.append(f"reduction({SIMD_RED[rtype]}:{acc})")
        elif rtype in UDR and dt in (torch.float32, torch.float64):
            parts.append(f"reduction({UDR[rtype]}:{acc})")
        elif rtype in UDR:
            parts.append(f"reduction({rtype}:{acc})")
        else:
            return None
    return " ".join(parts)
