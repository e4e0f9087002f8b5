"""Stage 5, schedule: reductions over a row's segments run in the row kernel that reads them.

GroupNorm's backward on [N, G, C/G, HxW] sums grad*x and grad over HxW per channel (a kernel
over N, G, C/G), then those sums over C/G per group and computes d_input over [C/G, HxW] (a
kernel over N, G). fuse() keeps them apart (their outer loops differ), so d_input reads grad
and x from memory a second time; eager's CPU kernel does too. `merge_segments` puts the first
kernel's reduction stages into the second, in front, as *segmented* stages: for each point of
the kept dims (C/G), a reduction over the rest (HxW). A group's block is then read from memory
once and re-read from the cache. docs/design/045-segmented-reductions.md.

Conditions (K1 the earlier kernel, K2 the later one):
1. K1 is reduction stages only (no columns), and its outer loops are K2's followed by more,
   R: the two share the loop vars (K1's v-vars are K2's outer vars and then R's), so indices
   compare as they are.
2. Nothing between K1 and K2 reads K1's results (they are computed later now); K2 reads them
   at the index K1 writes them (a reduction over R, or a stage over R), or anywhere in the
   row K1 stores in the same outer iteration (a sum over a small R unrolled into loads,
   GroupNorm's over 2 or 4 channels per group; deps.row_gather).
3. K2 reads a buffer K1 reads (the point: the block is in the cache), one segment's row
   (K1's inner size times R) has at most ROW_MAX elements and K2 has at least MIN_ROWS outer
   iterations (its loop is the parallel one).
C++ only (schedule(columns=True)): Triton's stages have no loops of their own to keep.

Consumes: steps from fuse(), NodeDeps. Produces: the steps with such pairs merged.
"""
from __future__ import annotations

from ..loopir.index import hint, is_symbolic, numel
from ..loopir.nodes import owns_loops
from ..loopir.plan import Kernel, Stage
from .deps import row_gather

#: elements of one segment row (a group's block): it is re-read from the cache
ROW_MAX = 1 << 18
#: outer iterations of the merged kernel, at least: its parallel loop (the per-channel sums
#: were parallel over N*C, now over N*G; eager's d_input loop is too)
MIN_ROWS = 8


def merge_segments(steps, deps) -> list:
    steps = list(steps)
    i = 0
    while i < len(steps):
        k1 = steps[i]
        j = _partner(steps, i, deps) if _segmentable(k1) else None
        if j is None:
            i += 1
            continue
        k2 = steps[j]
        kept = tuple(k1.outer[len(k2.outer):])
        k2.stages[:0] = [Stage("reduction", kept + tuple(s.inner), list(s.nodes), keep=len(kept))
                         for s in k1.stages]
        del steps[i]
    return steps


def _segmentable(k) -> bool:
    return isinstance(k, Kernel) and k.stages and all(
        s.kind == "reduction" and not s.columns and not s.keep and s.inner for s in k.stages)


def _partner(steps, i, deps):
    """The index of the kernel K1 = steps[i] merges into, or None (conditions 1-3)."""
    k1 = steps[i]
    outs = {n.name for n in k1.nodes}
    reads1 = {b for n in k1.nodes for b in deps[n.name].reads}
    for j in range(i + 1, len(steps)):
        k2 = steps[j]
        # (a scan kernel holds its scan alone: codegen/cpp_scan.py)
        m = len(k2.outer) if isinstance(k2, Kernel) and not owns_loops(k2.nodes[0]) else 0
        if m and len(k1.outer) > m and tuple(k1.outer[:m]) == tuple(k2.outer) \
                and not any(s.keep for s in k2.stages) and _fits(k1, k2) \
                and _reads_ok(k1, k2, outs, deps) \
                and any(b in reads1 for n in k2.nodes for b in deps[n.name].reads):
            return j
        if any(outs & set(deps[n.name].reads or {}) for n in k2.nodes):
            return None
    return None


def _fits(k1, k2) -> bool:
    row = numel(k1.outer[len(k2.outer):])
    inner = max(numel(s.inner) for s in k1.stages)
    return not is_symbolic(row) and not is_symbolic(inner) \
        and hint(numel(k2.outer)) >= MIN_ROWS and int(row) * int(inner) <= ROW_MAX


def _reads_ok(k1, k2, outs, deps) -> bool:
    m = len(k2.outer)
    kept = tuple(k1.outer[m:])
    for st in k2.stages:
        for n in st.nodes + st.columns:
            d = deps[n.name]
            inner = st.inner if n in st.nodes else ()
            for b, idxs in (d.reads or {}).items():
                if b in outs and not all(e == deps[b].write_index or (
                        n in st.nodes and row_gather(e, deps[b].write_index, m, inner, kept,
                                                     d.ind_sizes)) for e in idxs):
                    return False
    return True
