"""Stage 6, codegen: the loop of a scan kernel (a running sum, loopir.nodes.Scan) in C++.

A scan's dim is walked sequentially; the lanes are what does not depend on each other:

- the scanned dim has inner dims after it (cumsum over T of [B, T, D], over C of NCHW): for each
  point of the dims before it, one accumulator per inner element, and per step of the scan
  the inner dims are a simd loop `acc[i] += x[.., t, i]; out[.., t, i] = acc[i]` (one
  vectorized row add; eager walks each inner element's column separately, scalar and strided);
- the scanned dim is the innermost (cumsum over the last dim): blocks of ROWS rows of the
  dim before it are scanned together, one accumulator per row, so the rows' add chains overlap
  (eager walks one row at a time: one dependent add per element).

`reverse` scans from the end (a cumsum's gradient). The accumulator is eager's CPU acc type:
double for float32/float64, float for fp16/bf16, int64 for integers, so sums round as eager's.
Sizes are static (lower keeps a symbolic-size cumsum an extern).

Consumes: a Kernel holding one Scan node (schedule.fuse keeps it alone), the KernelCodegen
(handler, loop emitter). Produces: C++ statements in the handler's code.
"""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import contiguous_strides, numel, strided_index
from ..loopir.ops import compute_dtype
from .cpp_handler import CppVal, _int, cexpr, ctype
from .cpp_loops import loop_var
from .cpp_reduce import Span

ROWS = 8                  # rows scanned together along the innermost dim
LINE = 16                 # elements of a row scanned before the next row's
ACC_STACK_MAX = 16384     # accumulators of the inner elements kept on the stack (more: heap)
ACC_CHUNK = 2048          # accumulators of a chunk of the inner elements (16 KB of doubles)
PARALLEL_TASKS = 64       # parallel iterations wanted of a scan with inner dims
CHUNK_MIN = 64            # inner elements of a chunk at least (a few simd vectors)
CHUNK_ALIGN = 16          # a chunk's elements: a multiple of this


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Eager's CPU accumulation type of a cumsum to `dtype` (at::acc_type<T, false>)."""
    if dtype in (torch.float32, torch.float64):
        return torch.float64
    if dtype.is_floating_point:
        return torch.float32
    return torch.int64


def dim_loops(h, body):
    """The loops of a body that walks its `dim` itself (a Scan, a Scatter): its sizes, loop
    vars, the index of its element (size-1 dims 0), the non-1 dims before `dim` and after it,
    `dim` and its size. Sets the handler's loop ranges."""
    size = [int(s) for s in body.size]
    vars_ = [loop_var(i) for i in range(len(size))]
    index = [v if s != 1 else sympy.Integer(0) for v, s in zip(vars_, size)]
    h.ranges = {v: s for v, s in zip(vars_, size) if s != 1}
    pre = [i for i in range(body.dim) if size[i] != 1]
    inner = [i for i in range(body.dim + 1, len(size)) if size[i] != 1]
    return size, vars_, index, pre, inner, body.dim, size[body.dim]


def scoped(h, fn) -> None:
    """fn's statements in a { block }, its temporaries forgotten after it."""
    code = h.code
    saved = h.push()
    code.writeline("{")
    code.level += 1
    fn()
    code.level -= 1
    code.writeline("}")
    h.pop(saved)


def emit_scan(cg, node, parallel: bool) -> None:
    h = cg.h
    code = h.code
    body = node.body
    size, vars_, index, pre, inner, d, n = dim_loops(h, body)
    acc_t = ctype(acc_dtype(node.dtype))
    cd = compute_dtype(node.dtype)
    t = vars_[d]
    t_loop = (f"for (int64_t {t} = {n - 1}; {t} >= 0; --{t})" if body.reverse
              else f"for (int64_t {t} = 0; {t} < {n}; ++{t})")

    def step(acc: str):
        """acc += the input at `index`; the output there = acc."""
        v = body.inner_fn(index)
        code.writeline(f"{acc} += static_cast<{acc_t}>({v});")
        h.store(node.name, strided_index(index, node.stride), CppVal(f"static_cast<{ctype(cd)}>({acc})", cd))

    if inner:
        sizes = [size[i] for i in inner]
        ivars = [vars_[i] for i in inner]
        npre = numel([size[i] for i in pre])
        rest = numel(sizes[1:])
        # the first inner dim is cut into chunks, each scanned whole with its accumulators
        # in L1 (ACC_CHUNK elements; the rows of an outer-dim cumsum over [T, H, W] would
        # otherwise stream a T x H x W double array), and into enough chunks for the threads
        # when few points come before the scanned dim (eager splits the columns among them)
        tasks = min(-(-sizes[0] // CHUNK_MIN), max(1, PARALLEL_TASKS // npre)) if parallel else 1
        span = min(-(-sizes[0] // tasks), max(1, ACC_CHUNK // rest))
        if span < sizes[0] and rest == 1:       # whole vectors per chunk
            span = min(-(-span // CHUNK_ALIGN) * CHUNK_ALIGN, sizes[0])
        chunks = -(-sizes[0] // span)
        m = span * rest
        chunk = loop_var(len(size))
        lo = chunk * span if chunks > 1 else 0
        flat = cexpr(sympy.expand(strided_index([ivars[0] - lo] + ivars[1:],
                                                contiguous_strides([span] + sizes[1:]))))
        first = Span(_int(lo) if chunks > 1 else "0",
                     f"std::min<int64_t>({_int(lo + span)}, {sizes[0]})" if chunks > 1
                     else str(sizes[0]), sizes[0])

        def per_point():
            if m <= ACC_STACK_MAX:
                code.writeline(f"alignas(64) {acc_t} acc[{m}];")
            else:
                code.writeline(f"static thread_local ember::RowScratch<{acc_t}> acc_scr;")
                code.writeline(f"{acc_t}* acc = acc_scr.get({m});")
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t i = 0; i < {m}; ++i) acc[i] = 0;")
            code.writeline(t_loop)
            scoped(h, lambda: cg._loops([first] + sizes[1:], ivars, False, simd_last=True,
                                     body=lambda: step(f"acc[{flat}]")))
        outer = [size[i] for i in pre] + ([chunks] if chunks > 1 else [])
        if outer:
            h.ranges[chunk] = chunks
            cg._loops(outer, [vars_[i] for i in pre] + ([chunk] if chunks > 1 else []), parallel,
                      simd_last=False, body=per_point)
        else:
            scoped(h, per_point)
        return
    if not pre:             # one row
        def one_row():
            code.writeline(f"{acc_t} acc = 0;")
            code.writeline(t_loop)
            scoped(h, lambda: step("acc"))
        scoped(h, one_row)
        return
    # the innermost dim: ROWS rows of the last dim before it at a time, one accumulator each
    last = pre[-1]
    rows = size[last]
    block, r = loop_var(len(size)), loop_var(len(size) + 1)
    h.ranges.update({block: -(-rows // ROWS), r: ROWS})
    index[last] = ROWS * block + r

    def per_block():
        code.writeline(f"const int64_t rn = std::min<int64_t>({ROWS}, {rows} - {ROWS} * {block});")
        code.writeline(f"{acc_t} acc[{ROWS}] = {{}};")
        # a whole block: LINE elements of each row in turn (a cache line read and written
        # whole), the rows' chains written out one after the other (independent: the CPU
        # overlaps them, accumulators in registers)
        code.writeline(f"if (rn == {ROWS})")

        def full_block():
            tb = f"{t}_b"
            if body.reverse:
                code.writeline(f"for (int64_t {tb} = {(n - 1) // LINE * LINE}; {tb} >= 0; {tb} -= {LINE})")
            else:
                code.writeline(f"for (int64_t {tb} = 0; {tb} < {n}; {tb} += {LINE})")

            def unrolled():
                end = f"std::min<int64_t>({tb} + {LINE}, {n})"
                for k in range(ROWS):
                    index[last] = ROWS * block + k
                    code.writeline(f"for (int64_t {t} = {end} - 1; {t} >= {tb}; --{t})"
                                   if body.reverse else
                                   f"for (int64_t {t} = {tb}; {t} < {end}; ++{t})")
                    scoped(h, lambda k=k: step(f"acc[{k}]"))
                index[last] = ROWS * block + r
            scoped(h, unrolled)
        scoped(h, full_block)
        code.writeline("else")

        def part_block():
            code.writeline(t_loop)

            def rows_step():
                code.writeline(f"for (int64_t {r} = 0; {r} < rn; ++{r})")
                scoped(h, lambda: step(f"acc[{r}]"))
            scoped(h, rows_step)
        scoped(h, part_block)
    cg._loops([size[i] for i in pre[:-1]] + [-(-rows // ROWS)], [vars_[i] for i in pre[:-1]] + [block],
              parallel, simd_last=False, body=per_block)
