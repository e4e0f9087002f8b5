"""C++ loop planning: the index expressions a kernel body uses (IndexCollector), dim
reordering and merging (plan_loops), layout-conversion tiles, and the split of a dim read only
as v // k and v % k. Used by cpp.py and triton_kernel.py."""
from __future__ import annotations

import re

import sympy

from ..loopir.index import FloorDiv, ModularIndexing, hint, is_symbolic, numel, simplify_index, sym
from ..loopir.ops import OpsHandler, set_handler
from .cpp_handler import LOWP, STAGED_STORE
from .cpp_ranges import CMP, SWAP, bounds, decide


def loop_var(i):
    return sym(f"v{i}")



#: name prefix of the symbols IndexCollector stands in for gathered (indirect) indices
INDIRECT = "indirect"


def gathers(e) -> bool:
    """Whether index expression `e` (from IndexCollector) uses a gathered index."""
    return any(s.name.startswith(INDIRECT) for s in e.free_symbols)


class IndexCollector(OpsHandler):
    """Records every index expression a body uses (loads, stores, index_expr). A masked body
    whose mask is false over the whole `ranges` (a cat's other part in one segment of the
    loops, cpp_ranges) is not run: the kernel emits none of its loads either."""

    def __init__(self, ranges: dict):
        self.exprs: list = []
        self.stores: list = []
        self.loads: list = []     # (buffer, index, under a mask)
        self.n = 0
        self.ranges = ranges
        self.depth = 0            # masked bodies entered

    def load(self, name, index):
        index = simplify_index(sympy.expand(index), self.ranges)
        self.exprs.append(index)
        self.loads.append((name, index, self.depth > 0))

    def store(self, name, index, value):
        index = simplify_index(sympy.expand(index), self.ranges)
        self.exprs.append(index)
        self.stores.append(index)

    def index_expr(self, expr, dtype):
        e = simplify_index(sympy.expand(expr), self.ranges)
        self.exprs.append(e)
        return ("idx", e)

    def constant(self, value, dtype):
        return ("c", value)

    def masked(self, mask, body, other):
        if mask is False:
            return None
        self.depth += 1
        try:
            return body()
        finally:
            self.depth -= 1

    def indirect_indexing(self, value, size, check=True):
        self.n += 1
        return sym(f"{INDIRECT}{self.n}")

    def default(self, name, *args, **kwargs):
        """A compare of an index with a constant decided over `ranges`, and the logic of such
        decisions: True / False, else None (not known)."""
        if name in CMP and len(args) == 2:
            a, b = args
            if isinstance(b, tuple) and b[0] == "idx":
                a, b, name = b, a, SWAP[name]
            if not (isinstance(a, tuple) and a[0] == "idx"):
                return None
            k = b[1] if isinstance(b, tuple) else b
            lohi = bounds(a[1], self.ranges, {})
            return None if lohi is None else decide(name, *lohi, k)
        if name == "logical_and" and len(args) == 2:
            return False if False in args else (True if args == (True, True) else None)
        if name == "logical_or" and len(args) == 2:
            return True if True in args else (False if args == (False, False) else None)
        if name == "logical_not" and len(args) == 1 and isinstance(args[0], bool):
            return not args[0]
        return None


def collect(fn, ranges: dict) -> IndexCollector:
    """The index expressions `fn`'s body uses, simplified for loop vars in `ranges`."""
    c = IndexCollector(ranges)
    with set_handler(c):
        fn()
    return c


#: a pure pointwise simd loop over more memory streams than this (buffer regions it loads or
#: stores) is split into loops of about equal streams, at most this many each, between outputs
#: that share no stream (fission_groups)
FISSION_STREAMS = 12
#: two loads of one buffer are one stream when their indices differ by a constant below this
STREAM_NEAR = 64


def fission_groups(nodes, point, ranges, local=()) -> list[list] | None:
    """The nodes of a pure pointwise loop split into consecutive groups, one simd loop each,
    when the loop has more than FISSION_STREAMS streams; else None. A cut goes only before a
    node that shares no stream with the nodes before it in its group and reads nothing an
    earlier group wrote; the pieces between cuts are packed into ceil(streams /
    FISSION_STREAMS) loops of about equal streams. A cat's backward ([8, 16 x 16, 28, 28] ->
    16 slices of relu's gradient: 32 streams read, 16 written, one loop) ran 0.49 ms, as 16
    loops 0.30 ms, as 4 loops of 12 streams 0.32-0.35 ms (C micro, design 082); with 4x the
    data (from DRAM) 16 loops lost (3.7 -> 4.0 ms) where 4 loops won (3.4-3.8 -> 2.5-3.1), and
    4 or 2 slices kept whole ran faster than split: so loops of about 12 streams. Groups run in
    node order, so a node stored in place over a buffer (schedule/memory.can_write_in_place:
    no later node reads it) still comes after every reader of that buffer. `local`: the
    kernel's buffers kept in registers (no stream; their readers stay in their writer's
    group). Not split: a gathered index."""
    if len(nodes) < 2:
        return None
    streams, reads = [], []
    for n in nodes:
        c = collect(lambda: n.store_pointwise(point), ranges)
        if any(gathers(i) for _, i, _ in c.loads):
            return None
        reads.append({name for name, _, _ in c.loads})
        streams.append([(name, i) for name, i, _ in c.loads if name not in local]
                       + ([(n.name, i) for i in c.stores] if n.name not in local else []))

    def near(a, b):
        if a[0] != b[0]:
            return False
        d = sympy.expand(a[1] - b[1])
        return d.is_number and abs(d) < STREAM_NEAR

    def count(ss):
        distinct = []
        for s in ss:
            if not any(near(s, t) for t in distinct):
                distinct.append(s)
        return len(distinct)
    total = count([s for ss in streams for s in ss])
    if total <= FISSION_STREAMS:
        return None
    pieces, seen, done = [[0]], list(streams[0]), set()
    for j in range(1, len(nodes)):
        if reads[j] & done:       # reads a buffer an earlier piece wrote
            return None
        if reads[j] & {nodes[i].name for i in pieces[-1]} \
                or any(near(s, t) for s in streams[j] for t in seen):
            pieces[-1].append(j)
            seen += streams[j]
        else:
            done |= {nodes[i].name for i in pieces[-1]}
            pieces.append([j])
            seen = list(streams[j])
    budget = -(-total // -(-total // FISSION_STREAMS))
    groups, have = [], budget
    for p in pieces:
        k = count([s for i in p for s in streams[i]])
        if have + k > budget:
            groups.append([])
            have = 0
        groups[-1] += [nodes[i] for i in p]
        have += k
    return groups if len(groups) > 1 else None


def _coeff(e, v):
    return e.coeff(v) if e.has(v) else 0


def opaque_vars(exprs) -> set:
    """The symbols of `exprs` that some div/mod atom reads (a loop var there is no affine dim)."""
    opaque = set()
    for e in exprs:
        for f in e.atoms(FloorDiv, ModularIndexing):
            opaque |= f.free_symbols
    return opaque


def plan_loops(ranges, vars_, exprs, order=None):
    """Loop nest (sizes, vars) after reordering dims by `order` and merging adjacent dims
    that every index treats as one (coef[outer] == coef[inner] * size[inner], no div/mod).
    Returns (sizes, vars, subs) where subs maps merged-away vars to 0 and the surviving var
    of a group ranges over the product."""
    dims = list(order if order is not None else range(len(ranges)))
    opaque = opaque_vars(exprs)
    groups = []
    for d in dims:
        v = vars_[d]
        if groups and v not in opaque and vars_[groups[-1][-1]] not in opaque:
            last = vars_[groups[-1][-1]]
            if all(_coeff(e, last) == _coeff(e, v) * ranges[d] for e in exprs):
                groups[-1].append(d)
                continue
        groups.append([d])
    sizes, out_vars, subs = [], [], {}
    for g in groups:
        sizes.append(numel([ranges[d] for d in g]))
        out_vars.append(vars_[g[-1]])
        for d in g[:-1]:
            subs[vars_[d]] = sympy.Integer(0)
    return sizes, out_vars, subs


#: tile edge of a layout conversion (see _transposed_dim): a 32 x 32 float tile of the input is
#: 64 cache lines, each reused from L1 while the tile is walked (benchmarks/kernel_ab.py: 32
#: beat 16 and 64 on NCHW <-> NHWC of 8x128x28x28, 8x256x28x28 and 8x144x56x56)
TILE = 32


def _transposed_dim(sizes, lvars, exprs) -> int | None:
    """The loop (not the innermost one, along which the store is contiguous) along which some
    load is contiguous while it strides by at least TILE along the innermost one: a layout
    conversion (NHWC <-> NCHW, a permute). Walked row by row, each of the innermost loop's loads
    touches another cache line, and a line is reused only one outer iteration later, out of L1
    once the inner loop is long (NHWC -> NCHW of 8x256x28x28 ran at ~4 ns an element)."""
    if len(lvars) < 2 or any(is_symbolic(sz) for sz in sizes) or hint(sizes[-1]) < TILE:
        return None
    vi = lvars[-1]
    for e in exprs:
        c = _coeff(e, vi)
        if not (isinstance(c, sympy.Integer) and abs(int(c)) >= TILE):
            continue
        for d, v in enumerate(lvars[:-1]):
            if _coeff(e, v) == 1 and hint(sizes[d]) >= TILE:
                return d


#: iterations of a staged simd loop's chunk (cpp_handler.Staging): its float arrays stay in L1
#: (benchmarks/lowp_pointwise.py: 256 beat 128, 512 and 1024 on fp16 gelu 4x256x768)
STAGE_CHUNK = 256


def stage_chunks(lines, at, st, var, lo, hi, pragma, clauses):
    """Rewrite the simd loop whose header starts at lines[at] (its pragma, if any, then `for`
    and `{`; its body follows) into a loop over chunks of STAGE_CHUNK iterations, whose staged
    loads (Staging `st`) are converted into float arrays before the chunk's simd loop; the
    caller closes the simd loop, then writes `chunk_stores(st)` and closes the chunk loop.
    The chunk loop takes the loop's `omp parallel for` (and its clauses) if it had one; the simd
    loop gets `clauses` (reductions) and simdlen(16): it then reads the arrays as they were
    written (cpp_prelude.STAGED)."""
    head = 2 + (pragma is not None)
    ind = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    new = []
    if pragma is not None and "parallel" in pragma:
        new.append(ind + re.sub(r" simd\b", "", pragma, count=1))
    c, e = st.lo, f"{var}_e"
    new += [f"{ind}for (int64_t {c} = {lo}; {c} < {hi}; {c} += {STAGE_CHUNK})", ind + "{"]
    i2 = ind + "    "
    new.append(f"{i2}const int64_t {e} = std::min<int64_t>({c} + {STAGE_CHUNK}, {hi});")
    for (name, rest), (arr, dt) in {**st.loads, **st.stores}.items():
        new.append(f"{i2}alignas(64) float {arr}[{STAGE_CHUNK}];")
    for (name, rest), (arr, dt) in st.loads.items():
        new.append(f"{i2}ember::load_{LOWP[dt]}({_at(name, rest, c)}, {arr}, {e} - {c});")
    new.append(f"{i2}#pragma omp simd simdlen(16){clauses}")
    new += [f"{i2}for (int64_t {var} = {c}; {var} < {e}; ++{var})", i2 + "{"]
    lines[at:] = new + ["    " + line if line else line for line in lines[at + head:]]


def chunk_stores(st) -> list[str]:
    """The conversions (or streaming stores) of a staged loop's stores, after its chunk's simd
    loop."""
    return [f"ember::store_{STAGED_STORE[dt]}({arr}, {_at(name, rest, st.lo)}, {st.var}_e - {st.lo});"
            for (name, rest), (arr, dt) in st.stores.items()]


def _at(name, rest, lo) -> str:
    return f"{name} + {lo}" if rest == "0" else f"{name} + ({rest}) + {lo}"


def _drop_simd_over_masked_ifs(lines, start):
    """g++ 12 miscompiles `#pragma omp simd` over a loop whose body loads the two halves of a
    stride-2 group under `if (mask)` (constant_pad_nd of pairs: valid elements came out 0):
    an unrolled pair loop with an `if`-form masked load loses its simd pragma (the branch-free
    clamped form, which the unrolled loads normally take, is vectorized correctly)."""
    body = lines[start:]
    if not any(line.lstrip().startswith("if (") for line in body):
        return
    for i, line in enumerate(body, start):
        if line.lstrip().startswith("#pragma omp") and "simd" in line:
            kept = re.sub(r" simd(?:len\(\d+\))?(?![\w(])", "", line)
            lines[i] = kept if kept.strip() != "#pragma omp" else ""


def _divisors(v, exprs) -> list:
    """The divisors (b, and b*m of (x // b) % m) the div/mod atoms of `exprs` apply to sums
    over loop var `v`: integers largest first, then size expressions (dynamic shapes)."""
    ks = set()
    for e in exprs:
        for f in e.atoms(FloorDiv, ModularIndexing):
            if not f.args[0].has(v):
                continue
            b = f.args[1]
            ks |= {b} | ({b * f.args[2]} if isinstance(f, ModularIndexing) else set())
    ints = sorted((int(k) for k in ks if isinstance(k, sympy.Integer)), reverse=True)
    return [sympy.Integer(k) for k in ints] + sorted((k for k in ks if is_symbolic(k)), key=str)


def _quotient(n, k):
    """n / k when k splits a loop of n into (n/k, k) with both parts longer than 1, else None.
    A symbolic n splits only by a k that divides it as a polynomial (4*s2 by s2): the quotient
    is then a loop bound that holds for every size."""
    if not is_symbolic(n) and not is_symbolic(k):
        return sympy.Integer(int(n) // int(k)) if 1 < k < n and int(n) % int(k) == 0 else None
    q = sympy.cancel(n / k)
    if q.as_numer_denom()[1] != 1 or not q.as_coeff_Mul()[0].is_Integer or q == 1 or k == 1:
        return None
    return q


def split_divided(outer, xv, exprs_of, fresh=None, point=None):
    """A loop dim whose indices read it only as v // k and v % k is split into v = k*a + b,
    so the kernel loops over a and b with affine indices instead of dividing per element in
    a loop g++ does not vectorize. Two cases: a pointwise op on the flattened view of (..., n,
    2) pairs (LLaMA's `view_as_real(x).flatten(3).type_as(q)`, k = 2: the pair b is unrolled,
    see generate), and a pointwise op on a head-merging reshape of a batched matmul's output
    ([B, H, N, D] permuted to [B, N, H*D], levit's attention: k = D). Every dim that can be is
    split (swin's shifted-window mask reads three: windows, and both window-position dims).
    With dynamic shapes k may be a size symbol (D = s2 of a loop of 4*s2): the loops' bounds
    are then run-time values, with no division per element (design 054).
    A row reduction's stage splits its inner dims the same way (cpp.py _split_stage, design 055).
    `exprs_of(point, ranges)` collects the body's index expressions at loop point `point`;
    new loop vars are named from v{fresh} (default len(xv)). `point`: the original vars as
    expressions of the loop vars xv (default xv itself; a segment of a loop starts at an offset,
    cpp_ranges.presplit).
    Returns (ranges, loop vars, point): the loop nest, and the original vars in its vars."""
    ranges, lv, point = list(outer), list(xv), list(xv if point is None else point)
    fresh = len(xv) if fresh is None else fresh
    while True:
        c = exprs_of(point, dict(zip(lv, ranges)))
        done = _split_one(ranges, lv, c.exprs, fresh, point, exprs_of)
        if done is None:
            return ranges, lv, point
        ranges, lv, point = done
        fresh += 2


def _split_one(ranges, lv, exprs, fresh, point, exprs_of):
    """The first split of split_divided's loop nest (ranges, lv) that removes the div/mod of
    one dim, as (ranges, loop vars, point), or None. `point`: the original vars' expressions."""
    opaque = opaque_vars(exprs)
    for d, (v, n) in enumerate(zip(lv, ranges)):
        if v not in opaque:
            continue
        for k in _divisors(v, exprs):
            q = _quotient(n, k)
            if q is None:
                continue
            a, b = loop_var(fresh), loop_var(fresh + 1)
            new_ranges = ranges[:d] + [q, k] + ranges[d + 1:]
            new_lv = lv[:d] + [a, b] + lv[d + 1:]
            new_point = [sympy.expand(sympy.sympify(e).xreplace({v: k * a + b})) for e in point]
            split = exprs_of(new_point, dict(zip(new_lv, new_ranges)))
            if not any(f.has(a) or f.has(b) for e in split.exprs
                       for f in e.atoms(FloorDiv, ModularIndexing)):
                return new_ranges, new_lv, new_point
    return None
