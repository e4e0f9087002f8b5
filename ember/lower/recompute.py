"""Stage 4, lower: store a pointwise value that several nodes use, or recompute it in each of
their kernels (docs/design/039-recompute-or-store.md).

Counted in full-size memory accesses per element, a pending value P whose body loads the
buffers in(P), read by k consumer kernels:

    store:      |in(P)| + 1 + k        (P's kernel reads its inputs and writes P; each kernel loads P)
    recompute:  sum over the kernels K of |in(P) - loads(K)|

where loads(K) are the buffers kernel K reads anyway. BatchNorm+ReLU's backward is the case
this was written for: P = where(out > 0, dY, 0) feeds the two per-channel sums (one kernel,
fused horizontally; the second also reads the conv output x) and dX (reads x): store
2 + 1 + 2 = 5 accesses, recompute 2 + 2 = 4, and one kernel fewer.

The consumer kernels are read off the FX graph before they are lowered: the region of
pointwise nodes of P's shape around each user (what lowering will inline together), ending at
reductions (one kernel per reduction domain) and at nodes that need a stored input (an
extern, an output: one pointwise kernel). Nodes already lowered contribute the buffers their
values load. A user that needs P itself stored (an extern, a view, a broadcast), a symbolic
shape or a region over REGION_MAX nodes gives no answer: P is stored, as before.

Consumes: the GraphLowering's env and FX graph. Produces: `recompute_is_cheaper`, `feeds_reduction`.
"""
from __future__ import annotations

import sympy
import torch
import torch.fx

from ..loopir.ops import count_body

aten = torch.ops.aten

REGION_MAX = 64     # FX nodes visited per consumer region before giving up (store)
REDUCTIONS = frozenset({
    aten.sum.dim_IntList, aten.sum.default, aten.prod.dim_int, aten.prod.default,
    aten.amax.default, aten.amin.default, aten.mean.dim, aten.mean.default,
    aten.var_mean.correction, aten.var.correction})
VARIANCES = frozenset({aten.var_mean.correction, aten.var.correction})


def recompute_is_cheaper(env: dict, node: torch.fx.Node, ins: set) -> bool:
    """Whether inlining `node` (a pending value loading the full-size buffers `ins`) into all
    its consumer kernels moves fewer bytes than storing it once."""
    kernels = consumer_kernels(env, node)
    if not kernels:
        return False
    recompute = sum(len(ins - reads) for reads in kernels.values())
    return recompute <= len(ins) + 1 + len(kernels)   # a tie: one kernel pass fewer


def feeds_reduction(env: dict, node: torch.fx.Node) -> bool:
    """Whether a kernel that would inline `node` is a reduction's (over node's shape), none of
    whose reductions is a variance: its double form (lower/rules.var_mean) reads the row's first
    element besides each element, which keeps a stored producer out of the row kernel (it
    would go to memory, where inlined the variance's column form read it for free)."""
    regions = _regions(env, node)
    return regions is not None and any(key[0] == "reduce" for key in regions[0]) and \
        not any(n.target in VARIANCES for n in regions[1] if isinstance(n, torch.fx.Node))


def consumer_kernels(env: dict, node: torch.fx.Node) -> dict | None:
    """{kernel key: buffers that kernel loads} for the kernels that would inline `node`, or
    None when a consumer needs `node` stored or the graph is too tangled to tell."""
    regions = _regions(env, node)
    return None if regions is None else regions[0]


def _regions(env: dict, node: torch.fx.Node):
    """(consumer_kernels, the FX nodes of their regions), or None."""
    shape = _shape(node)
    if shape is None:
        return None
    kernels: dict = {}
    seen: set = set()
    for user in node.users:
        if not (_pointwise(user) and _shape(user) == shape or _reduces(user, shape)):
            return None     # an extern, view, output or broadcast reads node itself
        if user in seen:
            continue        # in the region of an earlier user: the same kernel
        region = _region(env, user, node, shape, len(kernels))
        if region is None:
            return None
        keys, reads, members = region
        seen |= members
        for k in keys:
            kernels.setdefault(k, set()).update(reads)
    return kernels, seen


def _region(env: dict, start: torch.fx.Node, skip: torch.fx.Node, shape: tuple, tag: int):
    """(kernel keys, buffers loaded, nodes) of the pointwise region of `shape` around `start`:
    one pointwise kernel (keyed by `tag`) if a node of it is stored, and one kernel per
    reduction domain it feeds (reductions over one domain fuse horizontally)."""
    keys: set = set()
    reads: set = set()
    seen = {skip}
    todo = [(start, True)]
    while todo:
        n, down = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > REGION_MAX:
            return None
        if n in env:                        # lowered already: its loads are this kernel's
            reads |= _full_loads(env[n], shape)
            continue
        if _pointwise(n) and _shape(n) == shape:
            todo += [(a, False) for a in n.all_input_nodes]
            todo += [(u, True) for u in n.users]
        elif down and _reduces(n, shape):
            keys.add(("reduce", tuple(_shape(n) or ())))
            todo += [(a, False) for a in n.all_input_nodes]
        elif down:                          # an extern/output/view: the region is stored for it
            keys.add(("store", tag))
        # upstream, not lowered and not pointwise: a later extern or a small broadcast value
    return keys, reads, seen


def _full_loads(value, shape: tuple) -> set:
    """Buffers a lowered value of `shape` loads at every element (not broadcast)."""
    size = getattr(value, "size", None)
    if size is None or tuple(size) != shape:
        return set()
    index = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(len(shape))]
    dims = [v for v, n in zip(index, shape) if n != 1]
    return count_body(value.loader(), index, dims=dims).full_names


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in val.shape):
        return None
    return tuple(val.shape)


def _pointwise(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and torch.Tag.pointwise in getattr(node.target, "tags", ())


def _reduces(node: torch.fx.Node, shape: tuple) -> bool:
    """A reduction whose input has `shape` (its kernel loads the region at full size)."""
    return node.op == "call_function" and node.target in REDUCTIONS and bool(node.args) and \
        _shape(node.args[0]) == shape
