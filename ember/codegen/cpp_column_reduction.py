"""C++ column reductions (cpp.py's third kernel form): reduction stages whose loads run along the
last outer dim vectorize across a block of that dim's columns, one accumulator per column, instead
of striding down each column once per stage (a sum over the batch of [B, F], BatchNorm's
statistics, softmax over C of NCHW, LayerNorm's weight gradient). A reduction that also reads an
input transposed (contiguous along the reduced dim) stages those row loads through small
transposed tiles (docs/design/068-transposed-row-tiles.md).

Used by cpp.py (KernelCodegen.generate). Consumes: a Kernel with reduction stages.
"""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import FloorDiv, ModularIndexing, hint, is_symbolic, numel
from .cpp_handler import CppVal, _blocks, _int, cexpr, ctype
from .cpp_loops import _coeff, collect, gathers, loop_var
from .cpp_reduce import ARG, CASCADE_ROWS, Span, _acc_value, _arg_better, _block_split, \
    _cascaded, _flat, _for, _init, _update, open_block

#: columns per block of a column reduction: the fewest, and all a symbolic count gets
COLUMN_BLOCK = 64
#: the most: a block as wide as the row (up to this) reads each row of a row-major matrix
#: as one contiguous run; 64-column blocks stepped a row stride (3 KB for LayerNorm(768)'s
#: weight gradient) per 256 bytes, and that kernel ran as long as the input gradient's,
#: which reads twice the data
COLUMN_BLOCK_MAX = 1024
#: bytes of accumulators a row of a block may update: 16 zmm registers. An accumulator block
#: updated in memory every row is store-bound: BatchNorm1d's double statistics over [4096, 768]
#: ran 1.6 ms in 768-column blocks, 0.8 ms in 64-column ones (registers), 1.5 ms in 128
#: (spilled) on Zen 4 (benchmarks/results/column_block_micro_2026-12-07_s23.txt); float sums
#: alike (design 082): one sum over [8, 512, 768] dim 1 0.25 -> 0.17 ms at 256 columns, one
#: over [4096, 768] 0.6 -> 0.24 ms, two sums 1.4-1.5 -> 0.9 ms at 128 (2.0 at 256: spilled)
#: (benchmarks/results/column_block_micro_2026-12-07_s24.txt)
ACC_BYTES = 1024


def plan_column_reduction(cg, xv) -> dict | None:
    """Reduction stages (and pointwise stages before and after them) whose loads run contiguously along
    the last *outer* dim and not along the reduced dims (but for loads the outer dim does not
    move): sum over the batch of [B, F], BatchNorm's statistics (sum, then centered sum of
    squares), softmax over dim 0 or over C of NCHW (max, sum of exp, output). Vectorize across
    the outer dim with a block of accumulators per stage instead of striding down each
    column once per stage. Returns the staged row loads (_row_tiles; {} for none), or None when
    the kernel does not take this form."""
    k = cg.kernel
    if not k.outer or k.row_local or not any(st.kind == "reduction" for st in k.stages) \
            or any(st.columns or st.keep for st in k.stages):
        return None
    if hint(k.outer[-1]) < 16:
        return None
    exprs = []
    for st in k.stages:
        rv = [loop_var(len(xv) + i) for i in range(len(st.inner))]
        if st.kind == "reduction":
            if any(n.body.reduction_type not in ("sum", "prod", "max", "min") + ARG
                   for n in st.nodes):
                return None
            if not rv:
                return None
            c = collect(lambda: [n.reduction_value(xv, rv) for n in st.nodes],
                        cg.ranges_with(rv, st.inner))
        elif rv:
            c = collect(lambda: [n.store_pointwise(xv + rv) for n in st.nodes],
                        cg.ranges_with(rv, st.inner))
        else:
            continue
        if not c.exprs:
            return None
        exprs += [(e, rv[-1], any(e is s for s in c.stores)) for e in c.exprs]
    last = xv[-1]
    # a load that does not move with the outer dim (a per-row mean in LayerNorm's weight
    # gradient) is one value for the whole block: contiguous along the reduced dim is fine.
    # One whose outer index sits only inside a div/mod (a gather of strided slices: Swin's
    # patch-merging cat) has coefficient 0 there but moves all the same: it is a row load;
    # so is one at a gathered index (an embedding row feeding LayerNorm: the index load moves
    # with the outer dim, the gathered row is contiguous along the reduced dim).
    # A store may be (LayerNorm over C of NCHW written channels-last, ConvNeXt's and
    # EdgeNeXt's permute + LayerNorm): one strided store per element across the lanes, where
    # the row form gathers each element in every stage (~26 ns an element)
    if not any(_coeff(e, last) == 1 for e, _, _ in exprs):
        return None
    if all(store or _coeff(e, rlast) != 1 or not (e.has(last) or gathers(e))
           for e, rlast, store in exprs):
        return {}
    return _row_tiles(cg, xv)


#: rows of the reduced dim per staged tile of a column reduction's row loads (_row_tiles):
#: 16 floats, one cache line of each row
ROW_TILE = 16


def _row_tiles(cg, xv) -> dict | None:
    """{stage index: [(buffer, index)]}: the loads of a kernel's reduction stages that run
    contiguously along the reduced dim (row loads) where another load runs along the last
    outer dim and strides by >= ROW_TILE elements along the reduced one (a transposed
    input: `(a * x.transpose(1, 2)).sum(-1)` with a [B, C, L], x [B, L, C]), or None.
    Cost rule: in the row form that load's simd loop takes one cache line per element, and
    a line comes back one row later, evicted by then (3-6x the contiguous time, worst at
    power-of-two strides, whose lines share a few L1 sets); the column form reads it
    contiguously across the lanes, and each row load, ROW_TILE rows at a time, from a
    small tile it is copied into one line per column (emit_column_reduction). Row loads must be
    plain: float32/64, affine, unmasked (the copy reads the whole tile), from a buffer the
    kernel does not write, striding by >= ROW_TILE along the last outer dim, with the
    reduced dim at least ROW_TILE long."""
    k = cg.kernel
    last = xv[-1]
    writes = {n.name for n in k.nodes} | set(k.local)
    tiles, transposed = {}, False
    for si, (st, rv, c) in enumerate(stage_indices(cg, xv)):
        if not rv:
            continue

        def row(e):
            return _coeff(e, rv[-1]) == 1 and (e.has(last) or gathers(e))
        loads = [(name, e) for name, e, masked in c.loads if row(e)]
        if len(loads) != sum(1 for e in c.exprs if row(e)
                             and not any(e is s for s in c.stores)):
            return None         # a row index_expr, not a load
        for name, e, masked in c.loads:
            cl = _coeff(e, last)
            if row(e) and (st.kind != "reduction" or masked or gathers(e) or name in writes
                           or e.atoms(FloorDiv, ModularIndexing)
                           or cg.buffers[name].dtype not in (torch.float32, torch.float64)
                           or not isinstance(cl, sympy.Integer) or abs(cl) < ROW_TILE
                           or hint(st.inner[-1]) < ROW_TILE):
                return None
            cr = _coeff(e, rv[-1])
            transposed |= cl == 1 and isinstance(cr, sympy.Integer) and abs(cr) >= ROW_TILE
        if loads:
            tiles[si] = list(dict.fromkeys(loads))
    return tiles if tiles and transposed else None


def stage_indices(cg, xv) -> list:
    """[(stage, its inner loop vars, IndexCollector of its bodies)] of a kernel, each stage's
    indices collected over the outer vars `xv` and its inner vars (none for a stage without
    inner dims)."""
    out = []
    for st in cg.kernel.stages:
        rv = [loop_var(len(xv) + i) for i in range(len(st.inner))]
        c = collect(lambda: [n.reduction_value(xv, rv) for n in st.nodes]
                    if st.kind == "reduction" else
                    [n.store_pointwise(xv + rv) for n in st.nodes],
                    cg.ranges_with(rv, st.inner)) if rv else None
        out.append((st, rv, c))
    return out


def _acc_block(k) -> int:
    """The most columns a block may have so that the accumulators one reduction stage updates
    every row (float at least: fp16/bf16 accumulate in float; a cascaded sum's row block is
    its float source) fit ACC_BYTES: a multiple of 16, at least 16."""
    width = COLUMN_BLOCK_MAX
    for st in k.stages:
        if st.kind != "reduction":
            continue
        per_column = sum(max(n.body.src_dtype.itemsize, 4) for n in st.nodes) + sum(
            8 for n in st.nodes if n.body.reduction_type in ARG)
        width = min(width, max(16, ACC_BYTES // per_column // 16 * 16))
    return width


def emit_column_reduction(cg, xv, parallel, row_tiles: dict):
    k, h = cg.kernel, cg.h
    code = h.code
    m = len(xv)
    L = k.outer[-1]
    B = COLUMN_BLOCK
    if not is_symbolic(L) and hint(L) > B:
        B = min(-(-hint(L) // 16) * 16, COLUMN_BLOCK_MAX, _acc_block(k))
    if row_tiles:
        # a block of ROW_TILE columns: its row loads are ROW_TILE streams, each staged
        # line used whole (as Inductor's 16 x 16 transposed tiles; wider blocks ran
        # no faster on tsum_512 / tsum_128, benchmarks/tstride_micro.py)
        B = ROW_TILE
    cg.column_capacity = B
    width = str(B)
    if B > COLUMN_BLOCK and m == 1 and parallel:
        # the blocks are the parallel loop: as wide as gives each thread one, not narrower
        # than COLUMN_BLOCK (read at run time: the kernel is cached across thread counts)
        width = "cw"
        code.writeline(f"const int64_t cw = std::min<int64_t>({B}, std::max<int64_t>("
                       f"{COLUMN_BLOCK}, ({_int(L)} / omp_get_max_threads() + 15) / 16 * 16));")
    nblk = _blocks(L, B) if width == str(B) else f"({_int(L)} + cw - 1) / cw"
    saved = h.push()
    for i, (size, v) in enumerate(zip(k.outer[:-1], xv[:-1])):
        if i == 0 and parallel:
            code.writeline("#pragma omp parallel for" + cg.par_if)
        code.writeline(f"for (int64_t {v} = 0; {v} < {_int(size)}; ++{v})")
        code.writeline("{")
        code.level += 1
    if m == 1 and parallel:
        code.writeline("#pragma omp parallel for" + cg.par_if)
    code.writeline(f"for (int64_t blk = 0; blk < {nblk}; ++blk)")
    code.writeline("{")
    code.level += 1
    code.writeline(f"int64_t lo = blk * {width}, n = std::min<int64_t>({width}, {_int(L)} - lo);")

    def lanes(body, simd=True, keep_stored=False):
        """for j in the block (xv[-1] = lo + j): body(). Its temporaries end with the loop;
        with keep_stored, what it stores (a stage's `acc[j]`) stays visible to later stages."""
        if simd:
            code.writeline("#pragma omp simd")
        code.writeline("for (int64_t j = 0; j < n; ++j)")
        code.writeline("{")
        code.level += 1
        code.writeline(f"int64_t {xv[-1]} = lo + j;")
        cse, stored = dict(h.cse), dict(h.stored)
        body()
        h.cse = cse
        if not keep_stored:
            h.stored = stored
        code.level -= 1
        code.writeline("}")

    def open_loops(sizes, vars_, tiles=()) -> int:
        for i, (size, v) in enumerate(zip(sizes, vars_)):
            if tiles and i == len(sizes) - 1:
                open_tiled(size, v, tiles)
                return len(sizes) + 1
            code.writeline(_for(v, size))
            code.writeline("{")
            code.level += 1
        return len(sizes)

    def open_tiled(size, v, tiles):
        """The reduced dim's loop in pieces of R rows; each piece first copies the rows'
        row loads into [R][width + 16] tiles (padded: a power-of-two width would put the
        tile's rows into the same L1 sets), one cache line per column, and the lanes
        read them from there (h.tiles)."""
        R, kb = ROW_TILE, h.fresh("kb")
        wp = B + 16
        lo_, hi_ = (size.lo, size.hi) if isinstance(size, Span) else (0, _int(size))
        code.writeline(f"for (int64_t {kb} = {lo_}; {kb} < {hi_}; {kb} += {R})")
        code.writeline("{")
        code.level += 1
        code.writeline(f"const int64_t {kb}_e = std::min<int64_t>({kb} + {R}, {hi_});")
        for name, e in tiles:
            t = h.fresh("tile")
            at = cexpr(e.xreplace({xv[-1]: sympy.Symbol("lo"), v: sympy.Symbol(kb)}))
            code.writeline(f"alignas(64) {ctype(cg.buffers[name].dtype)} {t}[{R * wp}];")
            code.writeline(f"ember::transpose_tile({name} + {at}, {_int(_coeff(e, xv[-1]))}, "
                           f"{t}, {wp}, n, {kb}_e - {kb});")
            h.tiles[(name, e)] = f"{t}[({v} - {kb}) * {wp} + j]"
        code.writeline(f"for (int64_t {v} = {kb}; {v} < {kb}_e; ++{v})")
        code.writeline("{")
        code.level += 1

    def close_loops(depth):
        for _ in range(depth):
            code.level -= 1
            code.writeline("}")

    for si, st in enumerate(k.stages):
        rv = [loop_var(m + i) for i in range(len(st.inner))]
        h.ranges = cg.ranges_with(rv, st.inner)
        tiles = row_tiles.get(si, ())
        if st.kind == "pointwise":
            if not rv:
                lanes(lambda: [n.store_pointwise(xv) for n in st.nodes], simd=False)
                continue
            depth = open_loops(st.inner, rv)
            lanes(lambda: [n.store_pointwise(xv + rv) for n in st.nodes])
            close_loops(depth)
            continue
        accs, widened = [], {}
        for n in st.nodes:
            dt, rt = n.body.src_dtype, n.body.reduction_type
            adt = torch.float64 if _cascaded(n, numel(st.inner)) else dt
            acc = h.fresh("acc")
            code.writeline(f"{ctype(adt)} {acc}[{B}];")
            code.writeline(f"for (int64_t j = 0; j < n; ++j) {acc}[j] = {_init(rt, adt)};")
            if rt in ARG:
                code.writeline(f"int64_t {acc}_i[{B}] = {{}};")
            accs.append((n, acc, rt, dt))
            widened[acc] = adt
        # a cascaded sum walks the rows in blocks (see _block_split): each column is summed
        # over a block in a float acc{k}_b[j], then added into the double acc{k}[j]
        cascade = [(acc, dt) for _, acc, _, dt in accs if widened[acc] != dt]
        i, c = _block_split(st.inner, CASCADE_ROWS) if cascade else (len(rv), 1)
        depth = open_loops(st.inner[:i], rv[:i], () if cascade else tiles)
        inner_depth = 0
        if cascade:
            span = open_block(h, st.inner[i], c)
            depth += 1
            for acc, dt in cascade:
                code.writeline(f"{ctype(dt)} {acc}_b[{B}];")
                code.writeline(f"for (int64_t j = 0; j < n; ++j) {acc}_b[j] = {_init('sum', dt)};")
            inner_depth = open_loops([span] + list(st.inner[i + 1:]), rv[i:], tiles)

        def update(accs=accs, rv=rv, inner=st.inner):
            for n, acc, rt, dt in accs:
                v = h._as(n.reduction_value(xv, rv), dt)
                if rt in ARG:
                    # selects, not a branch: the lanes vectorize (blends)
                    b = h.fresh("better")
                    code.writeline(f"bool {b} = {_arg_better(rt, v, f'{acc}[j]', dt)};")
                    code.writeline(f"{acc}_i[j] = {b} ? {_flat(rv, inner)} : {acc}_i[j];")
                    code.writeline(f"{acc}[j] = {b} ? {v} : {acc}[j];")
                    continue
                tgt = f"{acc}_b[j]" if widened[acc] != dt else f"{acc}[j]"
                code.writeline(_update(rt, tgt, v, dt))
        lanes(update)
        h.tiles = {}
        close_loops(inner_depth)
        for acc, _ in cascade:
            code.writeline("#pragma omp simd")
            code.writeline(f"for (int64_t j = 0; j < n; ++j) {acc}[j] += {acc}_b[j];")
        close_loops(depth)
        lanes(lambda accs=accs, widened=widened: [
            h.store(n.name, n.store_index(xv),
                    CppVal(f"{acc}_i[j]", torch.int64) if rt in ARG else
                    CppVal(_acc_value(f"{acc}[j]", widened[acc], dt), dt))
            for n, acc, rt, dt in accs], simd=False, keep_stored=True)
    code.level -= 1
    code.writeline("}")
    for _ in xv[:-1]:
        code.level -= 1
        code.writeline("}")
    h.pop(saved)
