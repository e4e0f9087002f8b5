"""C++ reductions' accumulators: initial values, update and combine statements, OpenMP
reduction clauses, cascaded (blocked float into double) long sums and the loop spans of their
blocks. Used by cpp.py's row stages and cpp_column_reduction.py."""
from __future__ import annotations

import math

import sympy
import torch

from ..loopir.index import hint
from .cpp_handler import _blocks, _int, cexpr, ctype, literal

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
#: bytes of the lane accumulators of a float row sum/max along a simd loop (docs/design/050):
#: 64 float lanes = 4 zmm registers, four independent add (or max) chains; one vector
#: accumulator waits on the add latency (4 cycles per 16 floats: 2.4x slower on a row in L1)
LANE_BYTES = 256


def lane_count(accs, counts) -> int:
    """Lanes per accumulator of a row reduction over a loop nest of `counts` iterations (the
    last one the simd loop), or 0 (one accumulator and an OpenMP reduction clause, as before).
    accs: [(rtype, dtype, fast)]: float/double sums, and max/min in the compare-select form with
    a NaN flag (fast). Element k of the simd loop goes to lane k % L, in order, and the lanes are
    combined as a fixed tree, so a sum does not depend on how g++ vectorizes it. A simd loop of
    at least 4 L iterations gets lanes, and so does one of a multiple of L iterations in a nest
    of at least 4 L (a dim split by L, design 055: lane k % L of the flat index, as unsplit)."""
    ok = all(dt in (torch.float32, torch.float64) and (rt == "sum" or fast)
             for rt, dt, fast in accs)
    if not accs or not ok or not counts:
        return 0
    lanes = LANE_BYTES // max(dt.itemsize for _, dt, _ in accs)
    inner = counts[-1]
    if inner >= 4 * lanes or (inner % lanes == 0 and math.prod(counts) >= 4 * lanes):
        return lanes
    return 0


def lane_tree(name: str, rtype: str, lanes: int) -> list[str]:
    """Combine lanes [w, 2w) into [0, w) for w = lanes/2 ... 1: lane 0 holds the result (a
    max/min's NaN is in its flag, so the tree is a plain compare-select)."""
    out, w = [], lanes // 2
    while w:
        b = f"{name}[j + {w}]"
        step = {"sum": f"{name}[j] += {b};",
                "max": f"{name}[j] = {b} > {name}[j] ? {b} : {name}[j];",
                "min": f"{name}[j] = {b} < {name}[j] ? {b} : {name}[j];"}[rtype]
        out.append(f"for (int64_t j = 0; j < {w}; ++j) {step}")
        w //= 2
    return out


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


#: a simd loop that sums over fewer iterations than this runs 8 lanes wide (256-bit for float
#: data): the loop is a few vectors, and the 16-lane form's tail and zmm horizontal sum cost
#: more than its adds save. Measured (docs/design/067, Zen 4, g++ 12, rows in cache): float
#: rows of 16-100 elements 1.4-2.0x faster at 8 lanes, 196 even, 256+ slower (0.8-0.5x); float
#: data summed in double 1.2-2.1x faster at 16-100 elements
SHORT_SIMD_SUM = 128


def short_simdlen(size, reduction) -> str:
    """' simdlen(8)' for a simd loop over `size` whose clauses (`reduction`) are all sums and
    whose trip count is a constant below SHORT_SIMD_SUM, else ''."""
    if not reduction or any(not c.startswith("reduction(+:") for c in reduction.split()):
        return ""
    if isinstance(size, Span):
        n = size.count() if size.lo.isdigit() and size.hi.isdigit() else None
    else:
        n = int(size) if isinstance(size, (int, sympy.Integer)) else None
    return " simdlen(8)" if n is not None and 0 < n < SHORT_SIMD_SUM else ""


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


def open_block(h, size, c, pragma=None) -> Span:
    """Open a loop over the blocks of c iterations of a dim of `size` in h's code (the caller
    closes it); returns the Span of the current block."""
    code = h.code
    b = h.fresh("blk")
    lo, hi = f"{b}_lo", f"{b}_hi"
    if pragma:
        code.writeline(pragma)
    code.writeline(f"for (int64_t {b} = 0; {b} < {_blocks(size, c)}; ++{b})")
    code.writeline("{")
    code.level += 1
    code.writeline(f"int64_t {lo} = {b} * {c}, {hi} = std::min<int64_t>({lo} + {c}, {_int(size)});")
    return Span(lo, hi, size)


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


def lane_loops(h, loops, sizes, lvars, accs, lanes: int, body):
    """Emit a reduction's loop nest over `sizes` with `lanes` accumulators per acc (accs:
    [(name, rtype, dtype, fast)]): the innermost loop in chunks of `lanes` iterations, iteration
    k of a chunk updating lane k of `name_l`, a tail loop, then the lane tree combined into
    `name` (and the NaN flags of fast max/min ORed into `name_nan`). body(targets) writes the
    updates; loops is KernelCodegen._loops."""
    code = h.code
    for name, rt, dt, fast in accs:
        code.writeline(f"alignas(64) {ctype(dt)} {name}_l[{lanes}];")
        code.writeline(f"for (int64_t j = 0; j < {lanes}; ++j) {name}_l[j] = {_init(rt, dt)};")
        if fast:
            code.writeline(f"alignas(64) int {name}_nan_l[{lanes}] = {{}};")

    def targets(start, v):
        return [(f"{n}_l[{v} - {start}]", f"{n}_nan_l[{v} - {start}]") for n, *_ in accs]

    def inner():
        size, v = sizes[-1], lvars[-1]
        lo, hi = (size.lo, size.hi) if isinstance(size, Span) else ("0", _int(size))
        full = size.size if isinstance(size, Span) else size
        base, end = h.fresh("lb"), h.fresh("le")
        if lo.isdigit() and hi.isdigit():
            code.writeline(f"int64_t {end} = {int(lo) + (int(hi) - int(lo)) // lanes * lanes};")
        else:
            code.writeline(f"int64_t {end} = {lo} + (({hi} - {lo}) & -{lanes});")
        code.writeline(f"for (int64_t {base} = {lo}; {base} < {end}; {base} += {lanes})")
        code.writeline("{")
        code.level += 1
        loops([Span(base, f"{base} + {lanes}", full)], [v], False, simd_last=True,
              body=lambda: body(targets(base, v)))
        code.level -= 1
        code.writeline("}")
        loops([Span(end, hi, full)], [v], False, simd_last=True,
              body=lambda: body(targets(end, v)))
    if len(sizes) > 1:
        loops(sizes[:-1], lvars[:-1], False, simd_last=False, body=inner)
    else:
        inner()
    for name, rt, _, fast in accs:
        for line in lane_tree(f"{name}_l", rt, lanes):
            code.writeline(line)
        code.writeline(_combine(rt, name, f"{name}_l[0]"))
        if fast:
            code.writeline(f"for (int64_t j = 0; j < {lanes}; ++j) {name}_nan |= {name}_nan_l[j];")
