"""Stage 5, schedule: group loop-IR nodes into kernels.

A `Kernel` is an outer loop nest `outer` whose body is a list of `Stage`s run one after another
for each outer index: a reduction stage (inner = reduced dims, one or more reductions in one
loop) or a pointwise stage (inner = the rest of the node's dims, possibly none). So a plain
pointwise kernel is one stage with no inner dims, softmax is [max, sum, pointwise] over rows and
LayerNorm+GELU is [sum, sum of squares, pointwise].

Nodes are visited in topological order; each joins the earliest kernel at or after its last
producer that (1) has compatible loops, (2) reads every buffer it shares with that kernel at
exactly the index the producer writes it (vertical fusion; reduction epilogues), and (3) is
related to it (vertical, or horizontal: shares an input). Otherwise it starts a new kernel.
A node only joins a kernel at or after all its producers, so fusion never creates a cycle.

Consumes: nodes in topological order, their `NodeDeps`. Produces: list of Kernel / ExternStep.
"""
from __future__ import annotations

import sympy

from ..loopir.index import is_symbolic, simplify_index
from ..loopir.nodes import owns_loops
from ..loopir.plan import ExternStep, Kernel, Stage
from .deps import loop_vars, row_gather as row_gather_at


def _placement(kernel: Kernel, node):
    """(kind, inner, resplit_outer) for putting node in kernel, or None when loops differ."""
    outer = kernel.outer
    if node.kind == "pointwise":
        r = node.ranges
        if r[:len(outer)] == outer:
            return "pointwise", r[len(outer):], None
        return None
    if node.ranges == outer:
        return "reduction", node.rranges, None
    if kernel.pure_pointwise and outer == node.ranges + node.rranges:
        return "reduction", node.rranges, node.ranges
    return None


ROW_GATHER_MAX = 16384     # elements of a row a kernel is split for (see _row_split)


def fuse(nodes, deps: dict, *, enable: bool = True, row_gather: bool = False) -> list:
    """`row_gather` (C++ only: a Triton stage's lanes do not see each other's stores): a
    pointwise node may read a pointwise buffer of the kernel anywhere in the row that buffer's
    stage stored in the same outer iteration (deps.row_gather), in a later stage; a pure
    pointwise kernel is split to the outer dims the two share for it (a separable
    interpolation: the rows interpolated along H, then gathered along W in the cache)."""
    steps: list = []
    where: dict = {}          # buffer name -> step index
    writer: dict = {}         # buffer name -> node
    stage_of: dict = {}       # buffer name -> Stage
    gathered: set = set()     # kernels with a row-gather stage: no reductions join them
    count = 0
    for node in nodes:
        d = deps[node.name]
        if node.kind == "extern":
            steps.append(ExternStep(node))
            for name in [node.name] + [o.name for o in node.outputs]:
                where[name] = len(steps) - 1
            continue
        first = max((where[b] for b in d.reads if b in where), default=0)
        placed = False
        # a scan (its own loop order, codegen/cpp_scan.py) joins no kernel, and none joins its
        for q in range(first, len(steps)) if enable and not owns_loops(node) else ():
            k = steps[q]
            if not isinstance(k, Kernel) or owns_loops(k.nodes[0]):
                continue
            place = _placement(k, node)
            rows = None
            if place is None and row_gather:
                rows = _row_split(k, node)
                place = None if rows is None else ("pointwise", tuple(node.ranges[rows:]), None)
            if place is None or (node.kind != "pointwise" and q in gathered):
                continue
            kind, inner, resplit = place
            inner_if_resplit = inner
            own = [b for b in d.reads if where.get(b) == q]
            ok = rows is None or bool(own)
            from_rows = set()     # stages this node reads rows of at other indices
            for b in own:
                w = writer[b]
                w_inner = node.rranges if resplit is not None else stage_of[b].inner
                write = deps[w.name].write_index
                if rows is not None:
                    w_inner = tuple(k.outer[rows:])
                if row_gather and node.kind == "pointwise" and w.kind == "pointwise" and \
                        resplit is None and all(st.kind == "pointwise" for st in k.stages) and any(idx != write for idx in d.reads[b]) and \
                        all(row_gather_at(idx, write, len(k.outer) if rows is None else rows,
                                          inner, w_inner, d.ind_sizes) for idx in d.reads[b]):
                    from_rows.add(id(stage_of[b]))
                    continue
                if rows is not None:
                    ok = False
                # (a pointwise value over leading inner dims only, a LayerNorm's mean and
                # rstd or a GroupNorm's per-channel scale, is read by a later stage of the same
                # outer iteration that loops over more dims, when that stage stores along its
                # innermost dim (not a channels-last output walked per channel); the index
                # check below makes sure it reads what was written)
                if w.kind == "pointwise" and tuple(w_inner) != tuple(inner_if_resplit) and (
                        resplit is not None or node.kind != "pointwise"
                        or tuple(w_inner) != tuple(inner)[:len(w_inner)]
                        or not _walks_rows(node, d)):
                    ok = False
                if any(idx != deps[w.name].write_index for idx in d.reads[b]):
                    ok = False
            if not ok:
                continue
            shares = own or any(b in _reads_of(k, deps) for b in d.reads)
            if not shares:
                continue
            if resplit is not None:
                k.outer = resplit
                for s in k.stages:
                    s.inner = inner
            if rows is not None:
                for s in k.stages:
                    s.inner = tuple(k.outer[rows:])
                k.outer = tuple(k.outer[:rows])
            if from_rows:
                gathered.add(q)
            last = k.stages[-1]
            if last.kind == kind and tuple(last.inner) == tuple(inner) and id(last) not in from_rows \
                    and not (kind == "reduction" and any(stage_of.get(b) is last for b in d.reads)):
                last.nodes.append(node)
                stage = last
            else:
                stage = Stage(kind, tuple(inner), [node])
                k.stages.append(stage)
            where[node.name], writer[node.name], stage_of[node.name] = q, node, stage
            placed = True
            break
        if not placed:
            kind = node.kind
            inner = node.rranges if kind == "reduction" else ()
            stage = Stage(kind, tuple(inner), [node])
            steps.append(Kernel(f"kernel{count}", tuple(node.ranges), [stage]))
            count += 1
            where[node.name], writer[node.name], stage_of[node.name] = len(steps) - 1, node, stage
    return steps


def _row_split(kernel: Kernel, node):
    """For a pointwise node whose loops are not the pure pointwise one-stage `kernel`'s: the
    number of leading dims the two share (a row split of the kernel), or None."""
    if node.kind != "pointwise" or not kernel.pure_pointwise or len(kernel.stages) != 1:
        return None
    p = 0
    for a, b in zip(kernel.outer, node.ranges):
        if a != b:
            break
        p += 1
    row = 1
    for n in kernel.outer[p:]:
        row = row * n
    # (a row that stays in the cache between the stages; a longer one is better stored)
    return p if 0 < p < len(kernel.outer) and not is_symbolic(row) and row <= ROW_GATHER_MAX \
        else None


def _walks_rows(node, d) -> bool:
    """Does pointwise `node` store and load along its innermost dim (stride 1, or 0)?"""
    if not node.ranges or d.indirect:
        return False
    xv = loop_vars(len(node.ranges))
    ranges = dict(zip(xv, node.ranges))
    # (a read through reshapes, 64*(v3 // 64) + v3 % 64, is v3 in the node's ranges)
    exprs = [d.write_index] + [e for es in d.reads.values() for e in (es or ())]
    return all(e is not None and sympy.diff(simplify_index(e, ranges), xv[-1]) in (0, 1)
               for e in exprs)


def _reads_of(kernel: Kernel, deps) -> set:
    out = set()
    for n in kernel.nodes:
        out.update(deps[n.name].reads)
    return out
