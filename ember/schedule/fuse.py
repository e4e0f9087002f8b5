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

from ..loopir.plan import ExternStep, Kernel, Stage
from .deps import loop_vars


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


def fuse(nodes, deps: dict, *, enable: bool = True) -> list:
    steps: list = []
    where: dict = {}          # buffer name -> step index
    writer: dict = {}         # buffer name -> node
    stage_of: dict = {}       # buffer name -> Stage
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
        for q in range(first, len(steps)) if enable else ():
            k = steps[q]
            if not isinstance(k, Kernel):
                continue
            place = _placement(k, node)
            if place is None:
                continue
            kind, inner, resplit = place
            inner_if_resplit = inner
            own = [b for b in d.reads if where.get(b) == q]
            ok = True
            for b in own:
                w = writer[b]
                w_inner = node.rranges if resplit is not None else stage_of[b].inner
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
            last = k.stages[-1]
            if last.kind == kind and tuple(last.inner) == tuple(inner) and not (
                    kind == "reduction" and any(stage_of.get(b) is last for b in d.reads)):
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


def _walks_rows(node, d) -> bool:
    """Does pointwise `node` store and load along its innermost dim (stride 1, or 0)?"""
    if not node.ranges or d.indirect:
        return False
    v = loop_vars(len(node.ranges))[-1]
    exprs = [d.write_index] + [e for es in d.reads.values() for e in (es or ())]
    return all(e is not None and sympy.diff(e, v) in (0, 1) for e in exprs)


def _reads_of(kernel: Kernel, deps) -> set:
    out = set()
    for n in kernel.nodes:
        out.update(deps[n.name].reads)
    return out
