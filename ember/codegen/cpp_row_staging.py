"""C++ row kernels whose rows are strided (docs/design/077-transposed-row-staging.md): a row-form
kernel (cpp.py: one row of each stage per outer point, the simd loop along the row) that
loads an input contiguous along the *outer* dims and strided along the row, LayerNorm over
the channels of an NCHW tensor (ConvNeXt's LayerNorm2d: rows of C read at stride H*W), walks
its outer positions in blocks of ROW_TILE, and at the top of each block copies those loads'
[row x ROW_TILE] blocks, transposed (ember::transpose_tile, 16 x 16 in zmm registers), into
small [ROW_TILE][row] tiles; the rows then read the tiles contiguously, every pass of every
stage from the same tile. Each row's statements, accumulators and summation order are those
of the plain row form: the values are the same bit for bit.

Used by cpp.py (KernelCodegen.generate). Consumes: a row-form Kernel.
"""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import FloorDiv, ModularIndexing, is_symbolic, numel
from .cpp_column_reduction import ROW_TILE, stage_indices
from .cpp_handler import ctype, cexpr
from .cpp_loops import _coeff, collect, gathers, loop_var

#: the types ember::transpose_tile moves in registers (cpp_prelude.TRANSPOSE)
STAGED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: elements of all a block's tiles together (on the thread's stack): rows up to ~1000 long
STAGED_MAX = 16384


def plan_row_staging(cg, xv) -> tuple | None:
    """(t, {(buffer, index): (stride, row length)}) for a row-form kernel whose stages load some
    buffer at stride >= ROW_TILE along the row and contiguously along the outer dims xv[t:]
    (which the block walks as one flat dim); None when it has none, or when one of them is not
    plain: float32/64 or bf16/fp16, affine, unmasked, from a buffer the kernel does not write, in a stage
    with one inner dim not split by a div/mod. Cost rule: the plain form's simd loop takes one
    cache line per element of such a load and uses 4 bytes of it (the rest comes back one row
    later, evicted by then at large strides); staged, every line is used whole."""
    k = cg.kernel
    m = len(xv)
    if not m or any(is_symbolic(n) for n in k.outer) or any(st.keep for st in k.stages):
        return None     # a stage keeping inner dims as outer ones walks other row vars
    writes = {n.name for n in k.nodes} | set(k.local)
    staged: dict = {}
    for st, rv, c in stage_indices(cg, xv):
        if not rv:
            continue
        for name, e, masked in c.loads:
            cr = _coeff(e, rv[-1])
            if _coeff(e, xv[-1]) != 1 or not isinstance(cr, sympy.Integer) or cr < ROW_TILE:
                continue
            if len(rv) != 1 or is_symbolic(st.inner[0]) or masked or gathers(e) \
                    or name in writes or any(f.free_symbols & set(rv) for f in
                                             e.atoms(FloorDiv, ModularIndexing)) \
                    or cg.buffers[name].dtype not in STAGED_DTYPES:
                return None
            if staged.setdefault((name, e), (int(cr), int(st.inner[0]))) != (int(cr),
                                                                              int(st.inner[0])):
                return None
        if staged and any(f.free_symbols & set(rv)
                          for e in c.exprs for f in e.atoms(FloorDiv, ModularIndexing)):
            return None     # the stage's loop would split (cpp.py _split_stage)
    if not staged:
        return None
    t = m - 1
    while t > 0 and all(_coeff(e, xv[t - 1]) == numel(k.outer[t:]) for _, e in staged):
        t -= 1
    if numel(k.outer[t:]) < ROW_TILE \
            or sum(ROW_TILE * _padded(n) for _, n in staged.values()) > STAGED_MAX:
        return None
    return t, staged


def _padded(n: int) -> int:
    """A tile's row: a whole number of cache lines plus one (a power-of-two row would put the
    tile's rows into the same L1 sets)."""
    return -(-n // 16) * 16 + 16


def emit_row_staging(cg, xv, staging, parallel, body):
    """The row form's outer loops with xv[t:] walked as one flat dim in blocks of ROW_TILE:
    the block stages its tiles, then runs body() (the rows' stages) per position, the outer
    vars xv[t:] computed from the flat one."""
    h = cg.h
    code = h.code
    t, staged = staging
    outer = list(cg.kernel.outer)
    flat = numel(outer[t:])
    qb, pr = h.fresh("qb"), h.fresh("pr")
    rv = loop_var(len(xv))

    def block():
        code.writeline(f"const int64_t {qb}_lo = {qb} * {ROW_TILE}, "
                       f"{qb}_n = std::min<int64_t>({ROW_TILE}, {flat} - {qb}_lo);")
        zero = {v: sympy.Integer(0) for v in xv[t:] + [rv]}
        for (name, e), (stride, n) in staged.items():
            tile, c, ds = h.fresh("tile"), h.fresh("c"), _padded(n)
            base = cexpr(e.xreplace(zero))
            code.writeline(f"alignas(64) {ctype(cg.buffers[name].dtype)} {tile}[{ROW_TILE * ds}];")
            code.writeline(f"for (int64_t {c} = 0; {c} < {n}; {c} += 16)")
            code.writeline(f"    ember::transpose_tile({name} + {base} + {qb}_lo + {stride} * {c}, "
                           f"{stride}, {tile} + {c}, {ds}, std::min<int64_t>(16, {n} - {c}), "
                           f"{qb}_n);")
            h.tiles[(name, e)] = f"{tile}[{pr} * {ds} + {rv}]"
        code.writeline(f"for (int64_t {pr} = 0; {pr} < {qb}_n; ++{pr})")
        code.writeline("{")
        code.level += 1
        q, inner = f"({qb}_lo + {pr})", 1
        for v, n in reversed(list(zip(xv[t:], outer[t:]))):
            at = q if inner == 1 else f"{q} / {inner}"
            code.writeline(f"const int64_t {v} = {at if v == xv[t] else f'{at} % {n}'};")
            inner *= int(n)
        body()
        code.level -= 1
        code.writeline("}")
        h.tiles = {}
    cg._loops(outer[:t] + [-(-flat // ROW_TILE)], xv[:t] + [qb], parallel, simd_last=False,
              body=block)


def staged_tile_loads(cg, store, lvars, d) -> list:
    """The loads of a layout conversion's tile (cpp.py _tiled: dim d and the innermost dim) that
    run contiguously along d and stride by >= ROW_TILE along the innermost (simd) dim, plain as
    in plan_row_staging: [(buffer, index, index over lvars, stride)]. The simd loop reads each
    from a transposed copy of its tile instead of one cache line per element."""
    h = cg.h
    writes = {n.name for n in cg.kernel.nodes}
    out = {}
    for name, e, masked in collect(store, h.ranges).loads:
        es = e.xreplace(h.subs)
        cr = _coeff(es, lvars[-1])
        if _coeff(es, lvars[d]) == 1 and isinstance(cr, sympy.Integer) and cr >= ROW_TILE \
                and not (masked or gathers(e) or name in writes
                         or es.atoms(FloorDiv, ModularIndexing)) \
                and cg.buffers[name].dtype in STAGED_DTYPES:
            out[(name, e)] = (es, int(cr))
    return [(name, e, es, s) for (name, e), (es, s) in out.items()]


def stage_tile_loads(cg, loads, lvars, d, spans, tile):
    """Copy each of `loads` (staged_tile_loads) for the tile over `spans` (Spans of dim d and the
    innermost dim), transposed, into a [tile][tile + 16] array that the simd loop reads."""
    h = cg.h
    code = h.code
    ds = tile + 16
    (lo0, hi0), (lo1, hi1) = ((s.lo, s.hi) for s in spans)
    for name, e, es, stride in loads:
        t, a, b = h.fresh("tile"), h.fresh("a"), h.fresh("b")
        base = cexpr(es.xreplace({lvars[d]: sympy.Symbol(lo0), lvars[-1]: sympy.Symbol(lo1)}))
        code.writeline(f"alignas(64) {ctype(cg.buffers[name].dtype)} {t}[{tile * ds}];")
        code.writeline(f"for (int64_t {a} = 0; {a} < {hi1} - {lo1}; {a} += 16)")
        code.writeline(f"    for (int64_t {b} = 0; {b} < {hi0} - {lo0}; {b} += 16)")
        code.writeline(f"        ember::transpose_tile({name} + {base} + {stride} * {a} + {b}, "
                       f"{stride}, {t} + {b} * {ds} + {a}, {ds}, "
                       f"std::min<int64_t>(16, {hi1} - {lo1} - {a}), "
                       f"std::min<int64_t>(16, {hi0} - {lo0} - {b}));")
        h.tiles[(name, e)] = f"{t}[({lvars[d]} - {lo0}) * {ds} + {lvars[-1]} - {lo1}]"
