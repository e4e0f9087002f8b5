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
from .cpp_handler import CppVal, cexpr, ctype
from .cpp_loops import loop_var

ROWS = 8                  # rows scanned together along the innermost dim
ACC_STACK_MAX = 16384     # accumulators of the inner elements kept on the stack (more: heap)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Eager's CPU accumulation type of a cumsum to `dtype` (at::acc_type<T, false>)."""
    if dtype in (torch.float32, torch.float64):
        return torch.float64
    if dtype.is_floating_point:
        return torch.float32
    return torch.int64


def emit_scan(cg, node, parallel: bool) -> None:
    h = cg.h
    code = h.code
    body = node.body
    size = [int(s) for s in body.size]
    d, n = body.dim, size[body.dim]
    vars_ = [loop_var(i) for i in range(len(size))]
    index = [v if s != 1 else sympy.Integer(0) for v, s in zip(vars_, size)]
    h.ranges = {v: s for v, s in zip(vars_, size) if s != 1}
    pre = [i for i in range(d) if size[i] != 1]
    inner = [i for i in range(d + 1, len(size)) if size[i] != 1]
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

    def scoped(fn):
        saved = h.push()
        code.writeline("{")
        code.level += 1
        fn()
        code.level -= 1
        code.writeline("}")
        h.pop(saved)

    if inner:
        sizes = [size[i] for i in inner]
        m = numel(sizes)
        flat = cexpr(strided_index([vars_[i] for i in inner], contiguous_strides(sizes)))

        def per_point():
            if m <= ACC_STACK_MAX:
                code.writeline(f"alignas(64) {acc_t} acc[{m}];")
            else:
                code.writeline(f"static thread_local ember::RowScratch<{acc_t}> acc_scr;")
                code.writeline(f"{acc_t}* acc = acc_scr.get({m});")
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t i = 0; i < {m}; ++i) acc[i] = 0;")
            code.writeline(t_loop)
            scoped(lambda: cg._loops(sizes, [vars_[i] for i in inner], False, simd_last=True,
                                     body=lambda: step(f"acc[{flat}]")))
        if pre:
            cg._loops([size[i] for i in pre], [vars_[i] for i in pre], parallel, simd_last=False,
                      body=per_point)
        else:
            scoped(per_point)
        return
    if not pre:             # one row
        def one_row():
            code.writeline(f"{acc_t} acc = 0;")
            code.writeline(t_loop)
            scoped(lambda: step("acc"))
        scoped(one_row)
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
        code.writeline(t_loop)

        def rows_step():
            code.writeline(f"for (int64_t {r} = 0; {r} < rn; ++{r})")
            scoped(lambda: step(f"acc[{r}]"))
        scoped(rows_step)
    cg._loops([size[i] for i in pre[:-1]] + [-(-rows // ROWS)], [vars_[i] for i in pre[:-1]] + [block],
              parallel, simd_last=False, body=per_block)
