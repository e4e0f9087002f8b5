"""Stage 6, codegen: kernels → one C++ translation unit (OpenMP + SIMD), no torch headers.

Each `Kernel` becomes `extern "C" void kernelN(T* buf, ...)` taking raw pointers. Bodies are
produced by running the loop IR under `CppHandler` (cpp_handler.py); this module plans and
emits the loop nests around them. The outer loop is `#pragma omp parallel for` when there is
enough work; contiguous inner loops get `#pragma omp simd` (with reduction clauses for
accumulators); a kernel that is one big reduction to a scalar uses per-thread partials.
Reductions down columns vectorize across a block of columns (cpp_column_reduction.py); long
float sums are cascaded (LONG_SUM); layout conversions walk tiles (TILE). fp16/bf16 are
accumulated in float.
Index compares of a cat/pad/stack are decided per loop segment (cpp_ranges): the innermost loop
is split into segments side by side, outer loops are unswitched (the nest once per segment
combination, docs/design/037-unswitching.md).
Loop planning (dim order and merging, tiles, div/mod splits) is in cpp_loops.py, accumulators and
reduction clauses in cpp_reduce.py.

Consumes: Kernel steps (schedule.fuse), buffers by name. Produces: C++ source + kernel argument
lists (buffer names, in order) for the wrapper.
"""
from __future__ import annotations

import sympy
import torch

from ..loopir.index import SIZE_NAME, FloorDiv, ModularIndexing, hint, is_symbolic, numel
from ..errors import InternalError
from ..loopir.nodes import Scatter, owns_loops
from ..loopir.ops import compute_dtype, set_handler
from ..loopir.plan import Stage
from .common import IndentedBuffer
from .cpp_column_reduction import emit_column_reduction, plan_column_reduction
from .cpp_columns import ColumnPartials
from .cpp_handler import CHECKED, CppHandler, CppVal, Staging, _int, cexpr, ctype, prune_dead
from .cpp_loops import TILE, _coeff, _drop_simd_over_masked_ifs, _transposed_dim, chunk_stores, \
    collect, fission_groups, loop_var, opaque_vars, plan_loops, split_divided, stage_chunks
from .cpp_prelude import PRELUDE, STAGED, TRANSPOSE
from .cpp_ranges import segment, split_points, unswitch
from .cpp_row_staging import emit_row_staging, plan_row_staging, stage_tile_loads, \
    staged_tile_loads
from .cpp_scan import emit_scan
from .cpp_scatter import emit_scatter
from .cpp_reduce import ARG, CASCADE_BLOCK, PARALLEL_BLOCK, SIMD_RED, UDR, Span, _acc_value, \
    _arg_better, _block_split, _cascaded, _combine, _count, _flat, _for, _init, _red_clause, \
    _update, lane_count, lane_loops, open_block, short_simdlen

PARALLEL_MIN_WORK = 32768
#: the fewest iterations of the loops _unswitched keeps around its copies (_shared_outer)
SHARED_OUTER_MIN = 64
#: the shortest innermost loop split per group of outputs (cpp_loops.fission_groups)
FISSION_MIN_INNER = 64
UNROLL = 4      # a pointwise kernel's innermost dim at most this long is unrolled (pairs, k <= 4)


# --- kernels -------------------------------------------------------------------------------

ROW_STACK_MAX = 16384    # elements of a row scratch kept on the stack (longer: RowScratch)


class KernelCodegen:
    def __init__(self, kernel, buffers: dict):
        self.kernel = kernel
        self.par_if = ""            # an OpenMP if() clause when the work is symbolic
        self.columns = None         # ColumnPartials of a row kernel with column sums
        self.buffers = buffers
        self.h = CppHandler(buffers, kernel.local, kernel.row_local,
                            [loop_var(i) for i in range(len(kernel.outer))])
        self.h.writes = {n.name for n in kernel.nodes}
        self.outer_ranges = {loop_var(i): n for i, n in enumerate(kernel.outer)}
        self.h.ranges = self.outer_ranges

    def ranges_with(self, rv, inner) -> dict:
        """Loop var sizes for a stage: the outer vars and this stage's inner vars (stages reuse
        the inner var names with their own sizes)."""
        return {**self.outer_ranges, **dict(zip(rv, inner))}

    def work(self):
        """Elements computed: an int, or a sympy expression of the size parameters."""
        k = self.kernel
        body = k.nodes[0].body
        if isinstance(body, Scatter):       # the base, then the index's elements
            return numel(body.size) // body.size[body.dim] * (body.size[body.dim] + body.count)
        inner = sum(numel(s.inner) * len(s.nodes) for s in k.stages)
        return numel(k.outer) * (inner if inner != 0 else 1)

    def generate(self, args: list) -> str:
        k, h = self.kernel, self.h
        outer = list(k.outer)
        m = len(outer)
        xv = [loop_var(i) for i in range(m)]
        code = h.code
        params = []
        writes = {n.name for n in k.nodes}
        for name in args:
            const = "" if name in writes else "const "
            params.append(f"{const}{ctype(self.buffers[name].dtype)}* {name}")
        code.writeline(f'extern "C" void {k.name}({", ".join(params)}/*SIZES*/)')
        code.writeline("{")
        code.level += 1
        work = self.work()
        parallel = hint(work) >= PARALLEL_MIN_WORK
        scalar_reduce = (m == 0 or hint(numel(outer)) == 1) and parallel and self._partials_ok()
        self.par_if = ""
        if is_symbolic(work):
            # sizes known at run time only: the outer loop is parallel when the call is big
            parallel = True
            self.par_if = f" if({cexpr(sympy.expand(work))} >= {PARALLEL_MIN_WORK})"
        if any(owns_loops(n) for n in k.nodes):
            if len(k.nodes) != 1:       # schedule keeps a scan alone; else it reads as pointwise
                raise InternalError(f"{k.name}: a scan or scatter kernel with other nodes")
            emit = emit_scatter if isinstance(k.nodes[0].body, Scatter) else emit_scan
            emit(self, k.nodes[0], parallel)
        elif k.pure_pointwise and m > 0:
            combos, plan = self._presplit(outer, xv)
            for spans in combos or [{}]:
                self._pointwise(outer, xv, spans, parallel, work, None if combos else plan)
        elif (row_tiles := plan_column_reduction(self, xv)) is not None:
            emit_column_reduction(self, xv, parallel, row_tiles)
        elif scalar_reduce:
            xv0 = [sympy.Integer(0)] * m
            for stage in k.stages:
                self._stage(stage, xv0, m, parallel_inner=True)
        else:
            cols = self.columns = ColumnPartials(k, h, parallel, self.par_if) \
                if any(st.columns for st in k.stages) else None
            team = cols is not None and parallel   # outer loops: `omp for` in the partials' region

            def body():
                for name, size in k.row_local.items():
                    dt = ctype(compute_dtype(self.buffers[name].dtype))
                    home = k.row_home.get(name)
                    if home is not None:    # the row of the buffer stored over it (memory.py)
                        node = self.buffers[home]
                        row0 = xv + [sympy.Integer(0)] * (len(node.ranges) - m)
                        idx = h.idx(h.simple(node.store_index(row0)))
                        code.writeline(f"{dt}* {name}_row = {home} + {idx};")
                    elif not is_symbolic(size) and size <= ROW_STACK_MAX:
                        code.writeline(f"alignas(64) {dt} {name}_row[{size}];")
                    else:   # too big for an OpenMP thread's stack: the thread's heap scratch
                        code.writeline(f"static thread_local ember::RowScratch<{dt}> {name}_scr;")
                        code.writeline(f"{dt}* {name}_row = {name}_scr.get({_int(size)});")
                stages = list(k.stages)
                while stages:
                    stage = stages.pop(0)
                    if stage.kind == "pointwise" and stage.inner and stages \
                            and stages[0].kind == "reduction" \
                            and tuple(stages[0].inner) == tuple(stage.inner) \
                            and not self._pre_alone(stage, stages[0], xv):
                        # the reduction over what the pointwise stage just computed runs in
                        # its loop (softmax's exp and sum: one pass over the row, not two)
                        self._stage(stages.pop(0), xv, m, parallel_inner=False, pre=stage)
                    else:
                        self._stage(stage, xv, m, parallel_inner=False)
                if cols:
                    cols.flush(every=True)
            def rows():     # every stage's body, for the compares on the row vars
                for st in k.stages:
                    rv = [loop_var(m + i) for i in range(len(st.inner))]
                    kv, rv = xv + rv[:st.keep], rv[st.keep:]
                    for n in st.nodes:
                        (n.reduction_value(kv, rv) if st.kind == "reduction"
                         else n.store_pointwise(kv + rv))
                    if cols:
                        cols.bodies(st, xv, rv)
            if cols:
                cols.open()
            staging = plan_row_staging(self, xv) if m and not cols else None

            def nest(sizes, lvars, par):
                if staging and list(sizes) == outer:    # not one segment of an unswitched nest
                    emit_row_staging(self, xv, staging, par, body)
                else:
                    self._loops(sizes, lvars, par or team, simd_last=False, body=body, team=team)
            if m:
                self._unswitched(outer, xv, xv, parallel, work, rows, nest)
            else:
                body()
            if cols:
                cols.close()
        if any("ember::store_stream(" in line for line in code.lines):
            code.writeline("ember::stream_fence();")
        code.level -= 1
        code.writeline("}")
        code.lines = prune_dead(code.lines)
        text = code.getvalue()
        # dynamic shapes: the size symbols the body uses are int64 parameters after the buffers
        self.size_params = sorted(set(SIZE_NAME.findall(text)), key=lambda n: int(n[1:]))
        sizes = "".join(f", int64_t {n}" for n in self.size_params)
        return text.replace("/*SIZES*/", sizes, 1)

    def _plan_pointwise(self, sizes, lv, point):
        """A pure pointwise kernel's loop plan over loop vars `lv` of `sizes`, the original vars
        being `point` (expressions of lv): its dims read only as v // k, v % k split
        (split_divided), reordered by the first store and merged (plan_loops). Returns
        (ranges, lv, point, sizes, lvars, subs, exprs): split dims, planned dims, and the
        index expressions at the split point."""
        nodes = self.kernel.stages[0].nodes

        def exprs_of(point, ranges):
            return collect(lambda: [n.store_pointwise(point) for n in nodes], ranges)
        ranges, lv, point = split_divided(sizes, lv, exprs_of, fresh=len(self.kernel.outer),
                                          point=point)
        c = exprs_of(point, dict(zip(lv, ranges)))
        first = c.stores[0] if c.stores else sympy.Integer(0)
        order = sorted(range(len(lv)), key=lambda d: -hint(_coeff(first, lv[d])))
        planned, lvars, subs = plan_loops(ranges, lv, c.exprs, order)
        return ranges, lv, point, planned, lvars, subs, c.exprs

    def _presplit(self, outer, xv) -> tuple[list[dict] | None, tuple | None]:
        """Segments of a pure pointwise kernel's loops (cpp_ranges.unswitch over every dim, the
        innermost too) to plan and emit one by one, or None to plan the kernel whole; and the
        whole kernel's plan (_plan_pointwise) when it was made. Taken when planning it whole
        leaves
        - a dim read as v // k, v % k under a compare on it: a padded dim (the gradient of a
          causal conv1d's input, [B, C, L+3] read as `v / 64`, `v % 64` under `v < 128`) splits
          by k only within its segment [0, 128), and a cat's part at an offset (v - 512) % 16
          is affine there; so when the copies without a div/mod hold at least half the work;
        - a tiled layout conversion (_transposed_dim) with compares: the tile loops decide
          none of them (a channel cat of transposed parts evaluated every part's loads,
          masked, per element); each copy is tiled, or not, on its own.
        Every copy then splits, plans and emits its own loop nest (_pointwise)."""
        if any(is_symbolic(n) for n in outer):
            return None, None
        plan = self._plan_pointwise(outer, list(xv), list(xv))
        _, _, _, planned, lvars, subs, exprs = plan
        opaque = opaque_vars(exprs)
        tiled = _transposed_dim(planned, lvars, [e.xreplace(subs) for e in exprs]) is not None
        dims = {v: n for v, n in zip(xv, outer) if tiled or v in opaque}
        if not dims:
            return None, plan
        nodes = self.kernel.stages[0].nodes
        combos = unswitch(lambda: [n.store_pointwise(xv) for n in nodes], dims,
                          dict(zip(xv, outer)), {})
        if combos is None or tiled:
            return combos, plan
        clean = 0
        for spans in combos:
            sizes, lv, point = segment(outer, xv, spans)
            _, lv, *_, exprs = self._plan_pointwise(sizes, lv, point)
            if not opaque_vars(exprs) & set(lv):
                clean += numel(sizes)
        return (combos if 2 * clean >= numel(outer) else None), plan

    def _pointwise(self, outer, xv, spans, parallel, work, plan=None):
        """A pure pointwise kernel's loop nest, or one copy of it over the segments `spans`
        ({var: (lo, hi)}, see _presplit); `plan`: the whole kernel's, when already made."""
        k, h = self.kernel, self.h
        code = h.code
        sizes0, lv0, point0 = segment(outer, xv, spans)
        if spans:       # this copy's share of the work
            work = hint(work) * numel(sizes0) // numel(outer)
            parallel = parallel and work >= PARALLEL_MIN_WORK
        ranges, lv, point, sizes, lvars, subs, exprs = plan or self._plan_pointwise(
            sizes0, lv0, point0)
        h.ranges = dict(zip(lv, ranges))
        h.subs = subs
        nodes = k.stages[0].nodes

        def store():
            for n in nodes:
                n.store_pointwise(point)
        d = _transposed_dim(sizes, lvars, [e.xreplace(subs) for e in exprs])
        if len(sizes) > 1 and not is_symbolic(sizes[-1]) and 1 < int(sizes[-1]) <= UNROLL:
            # an innermost dim of 2 (the (re, im) pair of a complex value, decomp/complex.py)
            # is unrolled, so the simd loop runs over the dim above it: g++ vectorizes the
            # stride-2 loads and stores as interleaved groups, not a 2-lane loop (RoPE's
            # complex multiply ran 3x slower than eager's); so are innermost dims of 3 and 4
            # (a [B, k, M] -> [B, M*k] permute split by k, design 048: 0.28 -> 2.1x eager at k = 3)
            def body():
                for k in range(int(sizes[-1])):
                    h.subs = {**subs, lvars[-1]: sympy.Integer(k)}
                    store()
                h.subs = subs
            start = len(code.lines)
            self._loops(sizes[:-1], lvars[:-1], parallel, simd_last=True, body=body)
            _drop_simd_over_masked_ifs(code.lines, start)
        elif d is not None:
            self._tiled(sizes, lvars, d, parallel, body=store)
        else:
            groups = fission_groups(nodes, point, h.ranges, k.local)
            parts = [lambda g=g: [n.store_pointwise(point) for n in g] for g in groups or ()]
            self._unswitched(sizes, lvars, lvars[:-1], parallel, work, store,
                             self._pointwise_nest(store, parts), shared_outer=True)
        h.subs = {}
        h.ranges = self.outer_ranges

    def _partials_ok(self) -> bool:
        for s in self.kernel.stages:
            if s.kind == "reduction":
                if any(n.body.reduction_type not in SIMD_RED and n.body.reduction_type not in UDR
                       for n in s.nodes):
                    return False
        return True

    def _loops(self, ranges, vars_, parallel, simd_last, body, reduction=None, partial=False,
               team=False):
        """Emit a loop nest over `ranges`; body() emits the innermost statements. partial: the
        first loop is an `omp for` of an enclosing parallel region; team: so are the first
        loops, collapsed as a `parallel for` would be (they hold column partials)."""
        code, h = self.h.code, self.h
        n = len(ranges)
        saved = h.push()
        for i, (size, v) in enumerate(zip(ranges, vars_)):
            last = i == n - 1
            pragma = None
            if i == 0 and parallel:
                if partial:
                    pragma = "#pragma omp for"
                elif team:
                    collapse = 1
                    prod = _count(size)
                    while prod < 64 and collapse < n:
                        prod *= _count(ranges[collapse])
                        collapse += 1
                    pragma = "#pragma omp for" + (f" collapse({collapse})" if collapse > 1 else "")
                else:
                    collapse = 1
                    limit = n - 1 if simd_last else n
                    prod = _count(size)
                    while prod < 64 and collapse < limit:
                        prod *= _count(ranges[collapse])
                        collapse += 1
                    pragma = "#pragma omp parallel for" + (
                        f" collapse({collapse})" if collapse > 1 else "")
                    if last and simd_last:
                        pragma += " simd"
                        if reduction:
                            pragma += " " + reduction
                    pragma += self.par_if
            elif last and simd_last:
                pragma = "#pragma omp simd" + short_simdlen(size, reduction) + (
                    f" {reduction}" if reduction else "")
            if last and simd_last:
                hoist_at = len(code.lines)
                hoisted = IndentedBuffer(code.level)
                simd_pragma = pragma is not None and "simd" in pragma
            if pragma:
                code.writeline(pragma)
            code.writeline(_for(v, size))
            code.writeline("{")
            code.level += 1
        outer = h.simd, h.hoisted, h.hoisted_cse, h.simd_oob, h.staging
        oob = st = None
        if n and simd_last:
            size = ranges[-1].size if isinstance(ranges[-1], Span) else ranges[-1]
            h.simd, h.hoisted, h.hoisted_cse = (vars_[-1], size), hoisted, {}
            oob = h.simd_oob = [h.fresh("oob"), False] if simd_pragma else None
            st = h.staging = Staging(vars_[-1], code, h.fresh) if simd_pragma else None
        body()
        if oob and oob[1]:     # gathers checked lane-wise: an OR reduction over the loop
            code.lines[hoist_at] += f" reduction(|:{oob[0]})"
            hoisted.writeline(f"int {oob[0]} = 0;")
        if st and (st.loads or st.stores):
            # fp16/bf16 operands contiguous along the loop: converted a chunk at a time
            lo, hi = (ranges[-1].lo, ranges[-1].hi) if isinstance(ranges[-1], Span) else (
                0, _int(ranges[-1]))
            clauses = (f" {reduction}" if reduction else "") + (
                f" reduction(|:{oob[0]})" if oob and oob[1] else "")
            stage_chunks(code.lines, hoist_at, st, vars_[-1], lo, hi,
                         code.lines[hoist_at].strip() if pragma else None, clauses)
            code.writeline("}")
            code.writelines(chunk_stores(st))
        if n and simd_last:
            code.lines[hoist_at:hoist_at] = hoisted.lines
        h.simd, h.hoisted, h.hoisted_cse, h.simd_oob, h.staging = outer
        for i in range(n):
            code.level -= 1
            code.writeline("}")
            if i == 0 and oob and oob[1]:
                code.writeline(f"if ({oob[0]}) ember::flag_index_oob();")
        h.pop(saved)

    def _tiled(self, sizes, lvars, d, parallel, body):
        """The loops of a layout conversion in TILE x TILE tiles of dim d and the innermost dim:
        the other dims and the two tile loops outside (parallel), then dim d and the innermost
        one (simd) within the tile; each tile first stages its transposed loads (cpp_row_staging.staged_tile_loads)."""
        code = self.h.code
        outer = [i for i in range(len(sizes) - 1) if i != d]
        blk = [self.h.fresh("blk"), self.h.fresh("blk")]
        tiled = [(blk[0], sizes[d]), (blk[1], sizes[-1])]
        staged = staged_tile_loads(self, body, lvars, d)

        def tile():
            spans = []
            for b, size in tiled:
                code.writeline(f"int64_t {b}_lo = {b} * {TILE}, "
                               f"{b}_hi = std::min<int64_t>({b}_lo + {TILE}, {_int(size)});")
                spans.append(Span(f"{b}_lo", f"{b}_hi", size))
            stage_tile_loads(self, staged, lvars, d, spans, TILE)
            self._loops(spans, [lvars[d], lvars[-1]], False, simd_last=True, body=body)
            self.h.tiles = {}
        # with staged loads, the tile loop along their contiguous dim d runs innermost: each
        # staged load then reads TILE rows in sequence (TILE streams, not one per row of the
        # plane: a [4, 512, 512] transpose 0.74 -> 0.25 ms); the loads read in place keep d outer
        order = tiled[::-1] if staged else tiled
        self._loops([sizes[i] for i in outer] + [-(-hint(sz) // TILE) for _, sz in order],
                    [lvars[i] for i in outer] + [b for b, _ in order], parallel,
                    simd_last=False, body=tile)

    def _unswitched(self, sizes, lvars, split, parallel, work, store, emit, shared_outer=False):
        """A loop nest, emitted once per combination of the segments of its loops `split` (the
        outer ones) between which index compares change value (cpp_ranges.unswitch), each copy
        with those compares decided, so its simd loops load only the branch they use.
        `emit(sizes, vars, parallel)` writes one copy; `store()` runs the whole body. A segment of
        one iteration is no loop: its var is a constant there (each part of a stack keeps the
        whole simd loop, parallel). Symbolic sizes split where the bounds order the segments
        for every size (a cat at `s0` along a loop of `s0 + 1`, docs/design/058).
        shared_outer: the loops outside the outermost split one are one nest around all the
        copies (_shared_outer), not repeated in each."""
        h = self.h
        dims = {v: n for v, n in zip(lvars, sizes) if v in split and h.ranges.get(v) == n}
        combos = unswitch(store, dims, h.ranges, h.subs) if dims else None
        subs = h.subs
        p = self._shared_outer(sizes, lvars, combos) if shared_outer else 0

        def copies(parallel):
            for spans in combos or [{}]:
                h.spans = dict(spans)
                h.subs = {**subs, **{v: sympy.sympify(lo) for v, (lo, hi) in spans.items()
                                     if hi - lo == 1}}
                keep = [i for i, v in enumerate(lvars) if i >= p and v not in h.subs]
                csizes = [Span(_int(spans[lvars[i]][0]), _int(spans[lvars[i]][1]), sizes[i])
                          if lvars[i] in spans else sizes[i] for i in keep]
                par = parallel
                if spans and par:   # this copy's share of the work (at the size hints)
                    share = hint(numel([hi - lo for lo, hi in spans.values()])) / hint(numel(
                        [sizes[lvars.index(v)] for v in spans]))
                    par = hint(work) * share >= PARALLEL_MIN_WORK
                emit(csizes, [lvars[i] for i in keep], par)
        if p:
            self._loops(sizes[:p], lvars[:p], parallel, simd_last=False, body=lambda: copies(False))
        else:
            copies(parallel)
        h.spans, h.subs = {}, subs

    @staticmethod
    def _shared_outer(sizes, lvars, combos) -> int:
        """How many outer loops (before the outermost split one) stay one nest around the
        copies of _unswitched: a reflection pad of [N*C, H, W] split along H walked the N*C
        planes once per H segment (three sweeps over 14 MB, the top and bottom ones touching a
        few lines a plane), where one sweep does each plane's segments in turn (0.45 -> 0.34 ms,
        benchmarks/results/unswitch_nest_micro_2026-12-07_s23.txt). Only when those loops have
        SHARED_OUTER_MIN iterations, so the parallel loop keeps enough work for the threads (a
        cat along C of a batch of 8 stays one nest per part)."""
        used = {v for c in combos or () for v in c}
        p = next((i for i, v in enumerate(lvars) if v in used), 0)
        outer = numel(sizes[:p])
        return p if p and not is_symbolic(outer) and hint(outer) >= SHARED_OUTER_MIN else 0

    def _pointwise_nest(self, store, parts=()):
        """emit() for _unswitched: the innermost loop split where compares change along it, or
        one innermost loop per part of the body (`parts`: fission_groups' stores) when it is at
        least FISSION_MIN_INNER long."""
        def emit(sizes, lvars, parallel):
            segments = self._segments(sizes, lvars, store)
            if segments is not None:
                self._split(sizes, lvars, segments, parallel, store)
            elif parts and lvars and _count(sizes[-1]) >= FISSION_MIN_INNER:
                def inner(par=False):
                    for part in parts:
                        self._loops(sizes[-1:], lvars[-1:], par, simd_last=True, body=part)
                if len(sizes) == 1:
                    inner(parallel)
                else:
                    self._loops(sizes[:-1], lvars[:-1], parallel, simd_last=False, body=inner)
            else:
                self._loops(sizes, lvars, parallel, simd_last=True, body=store)
        return emit

    def _segments(self, sizes, lvars, store):
        """The segments of the innermost loop between which the body's index compares change
        (cat or pad along the contiguous dim, cpp_ranges), when that loop is one dim unmerged.
        None also when no loop is left (a segment of one iteration made every var a constant)."""
        if not lvars:
            return None
        v, n = lvars[-1], sizes[-1]
        if is_symbolic(n) or self.h.ranges.get(v) != n:
            return None
        return split_points(store, v, n, self.h.ranges, self.h.subs)

    def _split(self, sizes, lvars, segments, parallel, store):
        """The innermost loop as one simd loop per segment, each with its compares decided."""
        h, v, n = self.h, lvars[-1], sizes[-1]
        outer = h.spans

        def inner(par=False):
            for lo, hi in segments:
                h.spans = {**outer, v: (lo, hi)}
                self._loops([Span(str(lo), str(hi), n)], [v], par, simd_last=True, body=store)
            h.spans = outer
        if len(sizes) == 1:
            inner(parallel)
        else:
            self._loops(sizes[:-1], lvars[:-1], parallel, simd_last=False, body=inner)

    def _blocked(self, sizes, lvars, accs, body, simd=True, omp_for=False):
        """A reduction stage's loop nest over `sizes` walked in blocks (see _block_split),
        updating `accs` [(name, rtype, dtype, acc dtype)] through body(targets). A cascaded sum
        (acc dtype wider than its dtype) gets a float accumulator per block, added into the wide
        one after the block. omp_for: the threads share the blocks (or the dims before them), and
        `accs` are per-thread partials."""
        code, h = self.h.code, self.h
        cascade = any(adt != dt for _, _, dt, adt in accs)
        i, c = _block_split(sizes, CASCADE_BLOCK if cascade else PARALLEL_BLOCK)

        def blocks():
            span = open_block(self.h, sizes[i], c, "#pragma omp for" if omp_for and i == 0 else None)
            targets = [f"{name}_b" if adt != dt else name for name, _, dt, adt in accs]
            for t, (name, rt, dt, adt) in zip(targets, accs):
                if t != name:
                    code.writeline(f"{ctype(dt)} {t} = {_init(rt, dt)};")
            clause = simd and _red_clause([(rt, t, dt) for t, (_, rt, dt, _) in zip(targets, accs)])
            self._reduce_loops([span] + list(sizes[i + 1:]), lvars[i:], simd, clause or None,
                               [(t, rt, dt, False) for t, (_, rt, dt, _) in zip(targets, accs)],
                               body)
            for t, (name, rt, _, _) in zip(targets, accs):
                if t != name:
                    code.writeline(_combine(rt, name, t))
            code.level -= 1
            code.writeline("}")
        if i:
            self._loops(sizes[:i], lvars[:i], omp_for, simd_last=False, body=blocks,
                        partial=omp_for)
        else:
            blocks()

    def _reduce_loops(self, sizes, lvars, simd, clause, accs, body):
        """A reduction's loop nest updating `accs` [(name, rtype, dtype, fast)] through
        body(targets) (an (accumulator, NaN flag) pair each; fast: a max/min as compare-select
        plus a NaN flag, see _stage): a simd loop with `clause`, or lane accumulators for long
        float rows (cpp_reduce.lane_loops)."""
        lanes = simd and not self.columns and lane_count(
            [(rt, dt, fast) for _, rt, dt, fast in accs], [_count(s) for s in sizes])
        if lanes:
            lane_loops(self.h, self._loops, sizes, lvars, accs, lanes, body)
        else:
            self._loops(sizes, lvars, False, simd_last=simd, reduction=clause,
                        body=lambda: body([(name, f"{name}_nan") for name, *_ in accs]))

    def _stage(self, stage, xv, m, parallel_inner, pre=None):
        """Emit one stage; `pre`: a pointwise stage over the same inner dims just before this
        reduction stage, computed in the reduction's loop (when it is a simd one). A stage's
        column sums (cpp_columns.py) are added in its loop after its nodes."""
        h = self.h
        code = h.code
        rv = [loop_var(m + i) for i in range(len(stage.inner))]
        if stage.keep:
            self._segmented(stage, xv, m, rv)
            return
        h.ranges = ranges = self.ranges_with(rv, stage.inner)
        cols = self.columns if stage.columns or (pre and pre.columns) else None
        if pre and (parallel_inner or _red_clause(
                [(n.body.reduction_type, "a", n.body.src_dtype) for n in stage.nodes]) is None):
            self._stage(pre, xv, m, parallel_inner)
            h.ranges = ranges
            pre = None
        pre_stages = [pre] if pre else []

        def adds():
            for st in pre_stages + [stage]:
                if st.columns:
                    cols.adds(st, xv, rv)

        def col_exprs():
            return [e for st in pre_stages + [stage] if st.columns
                    for e in cols.exprs(st, xv, rv, collect, ranges)]
        pre = pre.nodes if pre else ()
        if stage.kind == "pointwise":
            if not stage.inner:
                for n in stage.nodes:
                    n.store_pointwise(xv)
                if cols:
                    adds()
                return
            par = parallel_inner and hint(numel(stage.inner)) >= PARALLEL_MIN_WORK
            split, lv, point = list(stage.inner), rv, rv
            if not cols:
                split, lv, point = self._split_stage(
                    stage.inner, rv, lambda p: [n.store_pointwise(xv + p) for n in stage.nodes])
                h.ranges = self.ranges_with(lv, split)
            c = collect(lambda: [n.store_pointwise(xv + point) for n in stage.nodes], h.ranges)
            sizes, lvars, subs = plan_loops(split, lv, c.exprs + (col_exprs() if cols else []))
            h.subs = {**h.subs, **subs}

            def body():
                for n in stage.nodes:
                    n.store_pointwise(xv + point)
                if cols:
                    adds()
            self._loops(sizes, lvars, par, simd_last=True, body=body)
            for v in subs:
                h.subs.pop(v, None)
            return
        accs, widened = [], {}
        for n in stage.nodes:
            dt = n.body.src_dtype
            rt = n.body.reduction_type
            acc = h.fresh("acc")
            adt = widened[acc] = torch.float64 if _cascaded(n, numel(stage.inner)) else dt
            code.writeline(f"{ctype(adt)} {acc} = {_init(rt, adt)};")
            if rt in ARG:
                code.writeline(f"int64_t {acc}_i = 0;")
            accs.append((n, acc, rt, dt))
        clause = _red_clause([(rt, acc, dt) for _, acc, rt, dt in accs])
        # a float max/min row in one simd loop: a plain compare-select (vmaxps) on the
        # accumulator and the NaN test in a separate OR flag, off the loop-carried chain
        # (max_nan's three dependent ops per vector made a 128-wide row max 3x eager's time)
        fast = set()
        if clause is not None and not parallel_inner and all(widened[a] == dt for _, a, _, dt in accs):
            fast = {acc for _, acc, rt, dt in accs
                    if rt in ("max", "min") and dt in (torch.float32, torch.float64)}
            for acc in fast:
                code.writeline(f"int {acc}_nan = 0;")
            clause = " ".join(
                f"reduction({rt}:{acc}) reduction(|:{acc}_nan)" if acc in fast
                else _red_clause([(rt, acc, dt)]) for _, acc, rt, dt in accs)

        point = rv     # the original inner vars as expressions of the loop vars (a split)

        def body(targets):
            for n in pre:
                n.store_pointwise(xv + point)
            if cols:
                adds()
            for (n, acc, rt, dt), (tgt, nan) in zip(accs, targets):
                v = h._as(n.reduction_value(xv, point), dt)
                if acc in fast:
                    code.writeline(f"{nan} |= ({v} != {v});")
                    code.writeline(f"{tgt} = {v} {'>' if rt == 'max' else '<'} {tgt} ? {v} : {tgt};")
                elif rt in ARG:
                    code.writeline(f"if ({_arg_better(rt, v, acc, dt)}) "
                                   f"{{ {acc} = {v}; {acc}_i = {_flat(rv, stage.inner)}; }}")
                else:
                    code.writeline(_update(rt, tgt, v, dt))

        def values(p):
            return ([n.store_pointwise(xv + p) for n in pre]
                    + [n.reduction_value(xv, p) for n in stage.nodes])
        sizes, lvars, subs = list(stage.inner), rv, {}
        if clause is not None:
            c = collect(lambda: values(rv), ranges)
            sizes, lvars, subs = plan_loops(stage.inner, rv, c.exprs + (col_exprs() if cols else []))
            if not (parallel_inner or cols or any(widened[acc] != dt for _, acc, _, dt in accs)):
                lane_accs = [(rt, dt, acc in fast) for _, acc, rt, dt in accs]
                split = self._split_reduction(stage.inner, rv, values, sizes, lane_accs)
                if split is not None:
                    (sizes, lvars, subs), point = split
        h.subs = {**h.subs, **subs}
        if parallel_inner and clause is not None:
            # per-thread partials over `omp for` blocks, combined once per thread
            parts = [(n, h.fresh("part"), rt, widened[acc]) for n, acc, rt, _ in accs]
            code.writeline("#pragma omp parallel")
            code.writeline("{")
            code.level += 1
            for n, p, rt, adt in parts:
                code.writeline(f"{ctype(adt)} {p} = {_init(rt, adt)};")
            self._blocked(sizes, lvars, [(p, rt, dt, adt) for (_, p, rt, adt), (_, _, _, dt)
                                         in zip(parts, accs)], body, omp_for=True)
            code.writeline("#pragma omp critical")
            code.writeline("{")
            for (n, acc, rt, dt), (_, p, _, _) in zip(accs, parts):
                code.writeline("    " + _combine(rt, acc, p))
            code.writeline("}")
            code.level -= 1
            code.writeline("}")
        elif any(widened[acc] != dt for _, acc, _, dt in accs):
            self._blocked(sizes, lvars, [(acc, rt, dt, widened[acc]) for _, acc, rt, dt in accs],
                          body, simd=clause is not None)
        else:
            self._reduce_loops(sizes, lvars, clause is not None, clause,
                               [(acc, rt, dt, acc in fast) for _, acc, rt, dt in accs], body)
        for v in subs:
            h.subs.pop(v, None)
        for acc in sorted(fast):
            code.writeline(f"if ({acc}_nan) {acc} = std::numeric_limits<{ctype(widened[acc])}>"
                           "::quiet_NaN();")
        for n, acc, rt, dt in accs:
            result = CppVal(f"{acc}_i" if rt in ARG else _acc_value(acc, widened[acc], dt),
                            torch.int64 if rt in ARG else dt)
            h.store(n.name, n.store_index(xv), result)
            if h.simd is None:
                # final here: a later stage's simd loop hoists what it computes from it (an SE
                # block's sigmoid(mean) was recomputed for each of the row's elements)
                h.invariant.add(acc)


    def _pre_alone(self, pre, stage, xv) -> bool:
        """Does pointwise row stage `pre` run alone before the reduction `stage` that reads it,
        rather than in the reduction's loop? Yes when `pre` splits a dim read as v // k, v % k
        (_split_stage) and the merged pass would not split into lane loops (design 074): it
        keeps the gathers when the split would change a sum's lanes (a 784 row by 28), and a
        split without lanes has a short simd loop with a reduction clause per k elements (MViTv2
        softmax, 14 x 14 keys: 1.1x eager merged, 2.2x with `pre` alone). Alone, `pre` runs as
        affine loops into its row and the reduction reads that row."""
        rv = [loop_var(len(xv) + i) for i in range(len(stage.inner))]
        ranges = self.h.ranges = self.ranges_with(rv, stage.inner)
        lv = self._split_stage(stage.inner, rv,
                               lambda p: [n.store_pointwise(xv + p) for n in pre.nodes])[1]
        if list(lv) == list(rv):
            return False
        self.h.ranges = ranges
        if any(_cascaded(n, numel(stage.inner)) for n in stage.nodes):
            return True     # a cascaded sum is not split (_stage)

        def values(p):
            return ([n.store_pointwise(xv + p) for n in pre.nodes]
                    + [n.reduction_value(xv, p) for n in stage.nodes])
        accs = [(n.body.reduction_type, n.body.src_dtype, n.body.reduction_type in ("max", "min"))
                for n in stage.nodes]
        planned = plan_loops(stage.inner, rv, collect(lambda: values(rv), ranges).exprs)[0]
        split = self._split_reduction(stage.inner, rv, values, planned, accs)
        self.h.ranges = ranges
        return split is None or not lane_count(accs, [hint(s) for s in split[0][0]])

    def _split_stage(self, inner, rv, values):
        """A row stage's inner loops (sizes, vars, point) with every dim that its body reads
        only as v // k and v % k split into (n/k, k) (cpp_loops.split_divided, design 048): in
        the simd loop `4096*(v2 / 64) + (v2 % 64)` is a gather g++ does not vectorize (HF
        Mamba2's gated RMSNorm over a head-split scan output ran scalar, design 055).
        values(point) runs the stage's bodies at `point`; h.ranges must hold the outer vars."""
        outer = self.outer_ranges

        def exprs_of(point, ranges):
            return collect(lambda: values(point), {**outer, **ranges})
        return split_divided(inner, rv, exprs_of, fresh=len(outer) + len(inner))

    def _split_reduction(self, inner, rv, values, planned, lane_accs):
        """((sizes, vars, subs), point) of a reduction stage's loops after _split_stage, or None
        when nothing splits or when the split would change the stated summation order: with
        lane accumulators (design 050) element k of the row goes to lane k % L; that holds
        after the split when the simd loops before and after it are multiples of L long (the
        elements keep their order, so lane k % L of the flat index either way)."""
        split, lv, point = self._split_stage(inner, rv, values)
        if list(lv) == list(rv):
            return None
        ranges = self.ranges_with(lv, split)
        c = collect(lambda: values(point), ranges)
        sizes, lvars, subs = plan_loops(split, lv, c.exprs)
        before = lane_count(lane_accs, [hint(s) for s in planned])
        if before:
            after = lane_count(lane_accs, [hint(s) for s in sizes])
            if any(is_symbolic(s) for s in (planned[-1], sizes[-1])) or after != before \
                    or int(planned[-1]) % before or int(sizes[-1]) % before:
                return None
        self.h.ranges = ranges
        return (sizes, lvars, subs), point

    def _segmented(self, stage, xv, m, rv):
        """A segmented reduction stage (schedule/segments.py): serial loops over its kept dims,
        in them the reduction over the rest as a stage of a kernel whose outer loops include
        the kept ones; its accumulators are scoped to the loop (stored, never hoisted)."""
        h, code = self.h, self.h.code
        keep = stage.keep
        saved, outer_ranges, invariant = h.push(), self.outer_ranges, set(h.invariant)
        self.outer_ranges = {**outer_ranges, **dict(zip(rv[:keep], stage.inner[:keep]))}
        for v, size in zip(rv[:keep], stage.inner[:keep]):
            code.writeline(_for(v, size))
            code.writeline("{")
            code.level += 1
        self._stage(Stage("reduction", tuple(stage.inner[keep:]), stage.nodes),
                    list(xv) + rv[:keep], m + keep, parallel_inner=False)
        for _ in range(keep):
            code.level -= 1
            code.writeline("}")
        self.outer_ranges = outer_ranges
        h.ranges = outer_ranges
        h.pop(saved)
        h.invariant = invariant


def kernel_args(kernel, deps) -> list:
    names = []
    for n in kernel.nodes:
        for b in deps[n.name].reads:
            if b not in kernel.local and b not in names:
                names.append(b)
    for n in kernel.nodes:
        if n.name not in kernel.local and n.name not in names:
            names.append(n.name)
    return names


#: a float32 output at least this large that no node of the graph reads is stored with
#: non-temporal stores where its store is contiguous in a simd loop (cpp_prelude.STAGED
#: store_stream). The stores skip the read-for-ownership of each line (a third of a big
#: pointwise kernel's traffic) but leave the output out of the cache: in C (hardswish, Zen 4,
#: 32 MB L3, design 093) 38.5 MB ran 1.2-1.3x faster, read again right after still 1.08x;
#: 12.6 MB 1.27x faster, read again right after even; 6.3 MB read again lost 1.4x.
STREAM_MIN = 12 << 20


def streamed_outputs(kernels, deps, buffers: dict) -> set:
    """The kernels' float32 buffers of at least STREAM_MIN bytes (static sizes) that no node
    reads: graph outputs, which the caller reads later, if at all."""
    read = {b for d in deps.values() for b in (d.reads or {})}
    out = set()
    for k in kernels:
        for n in k.nodes:
            buf = buffers[n.name]
            if n.name in read or n.name in k.local or n.name in k.row_local \
                    or buf.dtype != torch.float32 or buf.size is None:
                continue
            size = numel(buf.size)
            if not is_symbolic(size) and int(size) * 4 >= STREAM_MIN:
                out.add(n.name)
    return out


def generate_tu(kernels, deps, buffers: dict) -> tuple[str, dict]:
    """(C++ source, {kernel name: [buffer names, then size symbols, in argument order]})."""
    out = [PRELUDE]
    signatures = {}
    streamed = streamed_outputs(kernels, deps, buffers)
    for k in kernels:
        args = kernel_args(k, deps)
        signatures[k.name] = args
        cg = KernelCodegen(k, buffers)
        cg.h.streamed = streamed
        with set_handler(cg.h):
            out.append(cg.generate(args))
        if CHECKED.search(out[-1]):     # load() checks ember_take_error after its calls
            out.append(f'extern "C" const int {k.name}_checked = 1;')
        signatures[k.name] = args + cg.size_params
    if any("ember::load_" in s or "ember::store_" in s for s in out[1:]):
        out.insert(1, STAGED)
    if any("ember::transpose_tile(" in s for s in out[1:]):
        out.insert(1, TRANSPOSE)
    return "\n".join(out), signatures
