"""Stage 5, schedule: column reductions computed in the row kernel that reads their inputs.

A reduction down the rows of what a row kernel reads or writes (LayerNorm's and RMSNorm's
weight and bias gradients: sums of dY * xhat and dY over all rows; `y.sum(0)` of a softmax
output) ran as its own kernel after fusion and read those rows from memory a second time.
`attach_columns` moves such a kernel's reductions into the row kernel, as `columns` of the stage
whose loop visits the same elements: the C++ backend adds each value into a per-thread partial
of the output in that loop and sums the threads' partials once at the end (a split reduction,
what ATen's CPU layer_norm_backward does by hand). docs/design/038-column-partials.md.

Consumes: steps from fuse(), NodeDeps. Produces: the steps with those kernels merged; a moved
node's NodeDeps are rewritten in the row kernel's loop vars (so memory.py compares its reads
with the kernel's writes like any other node's).
"""
from __future__ import annotations

import itertools

import sympy
import torch

from ..loopir.index import ModularIndexing, hint, numel, simplify_index
from ..loopir.nodes import owns_loops
from ..loopir.plan import ExternStep, Kernel, NodeDeps, Stage
from .deps import loop_vars

#: elements of one thread's partial (a vocabulary-sized `y.sum(0)` still fits)
COLUMN_MAX = 1 << 16
#: the row kernel's iterations per output element, at least: each thread zeroes, and the end
#: adds, a partial as large as the output
WORK_PER_OUTPUT = 16
#: loop dims tried in every order (a mapping is found by trying permutations)
MAX_DIMS = 6


def attach_columns(steps, deps) -> list:
    """Each kernel that is one stage of float sums over the rows of some row kernel's loop
    joins that kernel (the nearest one that reads or writes what it reads at the same
    elements), when its inputs are ready there and nothing reads its results before it."""
    steps = list(steps)
    for col in list(steps):
        if not _candidate(col, deps):
            continue
        ci = steps.index(col)
        order = sorted((j for j, s in enumerate(steps) if j != ci and _host(s)),
                       key=lambda j: abs(j - ci))
        for ri in order:
            if _attach(steps, ci, ri, deps):
                del steps[ci]
                break
    return steps


def _candidate(k, deps) -> bool:
    if not isinstance(k, Kernel) or len(k.stages) != 1 or k.stages[0].kind != "reduction":
        return False
    for n in k.nodes:
        b = n.body
        if b.reduction_type != "sum" or b.src_dtype not in (torch.float32, torch.float64) \
                or b.dtype != b.src_dtype or deps[n.name].indirect \
                or tuple(n.ranges) != tuple(k.outer) or hint(numel(n.ranges)) > COLUMN_MAX:
            return False
    return True


def _host(k) -> bool:
    """A row kernel: parallel over its outer dims, with a loop per stage (the C++ row path);
    or a one-stage pointwise kernel over at least two dims, which becomes one (_resplit)."""
    if not isinstance(k, Kernel) or not k.outer or hint(numel(k.outer)) <= 1 \
            or owns_loops(k.nodes[0]):
        return False
    return not k.pure_pointwise or (len(k.stages) == 1 and len(k.outer) > 1)


def _views(host):
    """The row kernels `host` may run as: itself, or a pointwise kernel split into rows, its
    last dims the inner loop of one stage (a GELU backward over [B, T, 4C] feeding a linear
    bias gradient, a sum over B, T: rows of 4C, the sum added in the row loop)."""
    if not host.pure_pointwise:
        return [host]
    nodes = host.stages[0].nodes
    return [Kernel(host.name, tuple(host.outer[:k]), [Stage("pointwise", tuple(host.outer[k:]),
                                                            list(nodes))])
            for k in reversed(range(1, len(host.outer)))]


def _attach(steps, ci, ri, deps) -> bool:
    col = steps[ci]
    made = _producers(steps)
    if ci < ri:
        outs = {n.name for n in col.nodes}
        for j in range(ci + 1, ri + 1):
            if any(outs & set(deps[n.name].reads or {}) for n in steps[j].nodes):
                return False
    for host in _views(steps[ri]):
        if _attach_to(host, col, deps, made, ri, ci):
            # (a split pointwise kernel: the same nodes and canonical loop vars, in rows)
            steps[ri].outer, steps[ri].stages = host.outer, host.stages
            return True
    return False


def _attach_to(host, col, deps, made, ri, ci) -> bool:
    # in the loop of a stage (the last that works), else in a new last loop over the row (a
    # value read there that only the columns read is then a row scratch, never stored), or once
    # per outer iteration (GroupNorm's weight gradients: per-(n, c) row sums, summed over n)
    stages = host.stages
    # (not a segmented stage, segments.py: its loop is a reduction's per kept point)
    tries = [(si, stages[si]) for si in reversed(range(len(stages))) if not stages[si].keep]
    tries += [(len(stages), Stage("pointwise", inner, [])) for inner in
              dict.fromkeys([tuple(s.inner) for s in reversed(stages) if s.inner] + [()])]
    for si, stage in tries:
        found = []
        for n in col.nodes:
            m = _mapping(host, si, stage, n, deps, made, ri, ci)
            if m is None:
                break
            found.append((n, m))
        else:
            if si == len(stages):
                stages.append(stage)
            for n, (axes, nd) in found:
                stage.columns.append(n)
                stage.axes[n.name] = axes
                deps[n.name] = nd
            return True
    return False


def _producers(steps) -> dict:
    out = {}
    for i, s in enumerate(steps):
        for n in s.nodes:
            out[n.name] = i
            for o in getattr(n, "outputs", []) if isinstance(s, ExternStep) else ():
                out[o.name] = i
    return out


def _mapping(host, si, stage, node, deps, made, ri, ci):
    """(axes, NodeDeps in the host's vars) for computing `node` in `stage`, the host's stage
    si (or a new one after the last), or None. The node's dims (outputs, then reduced) go one
    to one onto the host's outer dims (or the product of them: a linear layer's bias gradient
    sums [B*T, C] where the row kernel loops over B, T) and the stage's inner dims of the same
    sizes; the order is the one under which the node reads some buffer at an index the host
    also reads or writes it at. `axes`: each node dim's index in the host's loop vars."""
    m = len(host.outer)
    dims = list(host.outer) + list(stage.inner)
    ndims = list(node.ranges) + list(node.rranges)
    if hint(numel(dims)) < WORK_PER_OUTPUT * hint(numel(node.ranges)) or len(dims) > MAX_DIMS:
        return None
    stage_of = {n.name: i for i, s in enumerate(host.stages) for n in s.nodes}
    kv, nv = loop_vars(len(dims)), loop_vars(len(ndims))
    # a loop that walks rows (stride 1 or 0 along its innermost var): a column-major walk is
    # codegen's column-reduction form, which a kernel with columns does not take
    walk = kv[-1] if stage.inner else None
    if walk is not None and not _walks(walk, [deps[n.name] for n in stage.nodes]):
        return None
    views = [(dims, list(kv))]
    if m > 1:
        flat, stride = sympy.Integer(0), sympy.Integer(1)
        for v, size in reversed(list(zip(kv[:m], host.outer))):
            flat, stride = flat + v * stride, stride * size
        views.append(([numel(host.outer)] + list(stage.inner), [flat] + list(kv[m:])))
    d = deps[node.name]
    for vdims, vexprs in views:
        for ndims, r, expand in _node_views(node):
            if len(vdims) != len(ndims):
                continue
            for perm in itertools.permutations(range(len(vdims))):
                if any(vdims[p] != s for p, s in zip(perm, ndims)) or 0 not in perm[r:] \
                        or (stage.inner and len(vdims) - 1 not in perm[:r]):
                    # (the parallel outer dim must be a reduced one; the stage's simd loop
                    # an output one: its lanes add into distinct elements of the partial)
                    continue
                axes = expand([vexprs[p] for p in perm])
                found = _check(host, si, d, dict(zip(nv, axes)), dict(zip(kv, dims)), deps,
                               made, ri, ci, stage_of, walk)
                if found is not None:
                    return axes, found
    return None


def _node_views(node):
    """(dims, output dims, expand) for matching `node`'s dims: as they are, and with its output
    dims as one (GroupNorm's weight gradient, [G, C/G] summed over N, in a kernel over [N, C]);
    expand(exprs of those dims) -> exprs of the node's own dims."""
    r = len(node.ranges)
    out = [(list(node.ranges) + list(node.rranges), r, tuple)]
    if r > 1:
        def expand(exprs):
            x, stride, own = exprs[0], 1, []
            for size in reversed(node.ranges):
                own.append(ModularIndexing(x, stride, size))
                stride = stride * size
            return tuple(reversed(own)) + tuple(exprs[1:])
        out.append(([numel(node.ranges)] + list(node.rranges), 1, expand))
    return out


def _check(host, si, d, subs, ranges, deps, made, ri, ci, stage_of, walk):
    """The node's NodeDeps under `subs` (its vars -> host loop exprs over `ranges`) when its
    reads are ready in stage si and related to the host's (see _mapping), else None."""
    def at(e):      # (a read of the flattened rows, r // 128 and r % 128, becomes v0 and v1)
        return simplify_index(sympy.expand(e.xreplace(subs)), ranges)
    reads = {b: {at(e) for e in idxs} for b, idxs in d.reads.items()}
    related = False
    for b, idxs in reads.items():
        p = made.get(b)
        if p == ri:
            w = stage_of.get(b)
            if w is None or w > si or (w == si and host.stages[w].kind != "pointwise") \
                    or any(e != deps[b].write_index for e in idxs):
                return None
            related = True
        elif p is not None and min(ri, ci) < p < max(ri, ci):
            return None
        elif any(idxs & (deps[n.name].reads.get(b) or set()) for n in host.nodes):
            related = True
    if not related or (walk is not None and not _walks(walk, [NodeDeps(reads, None)])):
        return None
    return NodeDeps(reads, at(d.write_index), d.indirect, d.ind_sizes)


def _walks(v, node_deps) -> bool:
    exprs = [e for d in node_deps for es in d.reads.values() for e in (es or ())]
    exprs += [d.write_index for d in node_deps if d.write_index is not None]
    return all(sympy.diff(e, v) in (0, 1) for e in exprs)
