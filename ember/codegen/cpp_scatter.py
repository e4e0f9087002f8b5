"""Stage 6, codegen: the loops of a scatter kernel (loopir.nodes.Scatter) in C++.

A row (every dim but the scattered one) receives only from its own row of the index and the
source, so rows are the parallel lanes and no two threads write one element. Per point of the
dims before the scattered dim (parallel; with too few of them, chunks of the first dim after
it are the tasks too):

    out[.., j, i] = base[.., j, i]              for all j, i (a simd loop over the inner dims i)
    for k in 0..count-1:                        (in order: eager's serial loop)
        for i:                                  (independent rows: any order)
            j = index[.., k, i]                 (outside [0, n): flagged, eager's IndexError)
            out[.., j, i] += src[.., k, i]      (scatter: =)

so each element's sum is the base plus its sources added in index order in the output dtype,
as eager's `cpu_scatter_gather_base_kernel` adds them (float32/float64: bit for bit). The zero
fill or the copy of the base is the first loop; producers of the base, the index and the
source are inlined. Sizes are static (lower keeps symbolic sizes an extern).

Consumes: a Kernel holding one Scatter node (schedule.fuse keeps it alone), the KernelCodegen
(handler, loop emitter). Produces: C++ statements in the handler's code.
"""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import numel, strided_index
from ..loopir.ops import compute_dtype
from .cpp_handler import _int
from .cpp_loops import loop_var
from .cpp_reduce import Span
from .cpp_scan import dim_loops, scoped

PARALLEL_TASKS = 64       # parallel iterations wanted (chunks of the first inner dim if needed)
CHUNK_MIN = 64            # inner elements of a chunk at least


def emit_scatter(cg, node, parallel: bool) -> None:
    h = cg.h
    code = h.code
    body = node.body
    size, vars_, index, pre, inner, d, n = dim_loops(h, body)
    npre = numel([size[i] for i in pre])
    tasks = 1
    if parallel and inner and npre < PARALLEL_TASKS:
        tasks = max(1, min(-(-size[inner[0]] // CHUNK_MIN), PARALLEL_TASKS // npre))
    span = -(-size[inner[0]] // tasks) if inner else 1
    chunks = -(-size[inner[0]] // span) if inner else 1
    chunk = loop_var(len(size))
    kv = loop_var(len(size) + 1)
    h.ranges[kv] = body.count
    inner_ranges = [size[i] for i in inner]
    if chunks > 1:
        h.ranges[chunk] = chunks
        lo = chunk * span
        inner_ranges[0] = Span(_int(lo), f"std::min<int64_t>({_int(lo + span)}, {size[inner[0]]})",
                               size[inner[0]])
    ivars = [vars_[i] for i in inner]
    cd = compute_dtype(node.dtype)
    op = "+=" if body.accumulate else "="

    def base():
        h.store(node.name, strided_index(index, node.stride), body.base_fn(index))

    def add():
        p = [*index[:d], kv, *index[d + 1:]]
        j = h.fresh("j")
        code.writeline(f"const int64_t {j} = {h._as(body.index_fn(p), torch.int64)};")
        code.writeline(f"if (static_cast<uint64_t>({j}) >= {n}u) {{ ember::flag_index_oob(); continue; }}")
        value = h._as(body.src_fn(p), cd)
        to = [*index[:d], sympy.Symbol(j, integer=True, nonnegative=True), *index[d + 1:]]
        code.writeline(f"{node.name}[{h.idx(strided_index(to, node.stride))}] {op} {value};")

    def per_point():
        copy = ([n] if n != 1 else []) + inner_ranges
        copy_vars = ([vars_[d]] if n != 1 else []) + ivars
        if copy:
            cg._loops(copy, copy_vars, False, simd_last=True, body=base)
        else:
            scoped(h, base)
        code.writeline(f"for (int64_t {kv} = 0; {kv} < {body.count}; ++{kv})")
        if inner_ranges:
            scoped(h, lambda: cg._loops(inner_ranges, ivars, False, simd_last=False, body=add))
        else:
            scoped(h, add)

    outer = [size[i] for i in pre] + ([chunks] if chunks > 1 else [])
    if outer:
        cg._loops(outer, [vars_[i] for i in pre] + ([chunk] if chunks > 1 else []), parallel,
                  simd_last=False, body=per_point)
    else:
        scoped(h, per_point)

