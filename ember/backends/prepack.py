"""Backend "ember", freezing: MKL-packed weights for the linears of frozen graphs.

In a frozen inference graph (freeze.py) a linear whose weight is a constant and whose row count
M (the product of the input's leading sizes, static in the graph) is one where packing pays
(`pays`) becomes

    mkl._mkl_linear(x, packed, w, b, M)     packed = mkl._mkl_reorder_linear_weight(w, M)

with `packed` computed in the constant graph: once at freeze time, again at each refold (the
packed tensor is a folded constant like any other). MKL's packed GEMM skips the per-call weight
packing that `addmm` does: most of the work when M is small (decode, batch-1 inference), and
still 5-15% of a transformer's GEMM at M = 16..1024 (a batch of sequences); measured by
benchmarks/mkl_linear_threshold.py (docs/design/024, 041). Called with another row count,
`_mkl_linear` itself falls back to a plain GEMM on the original weight.

The op has a meta kernel, so aot traces it; lower runs it as a fallback extern. `packed` is an
opaque oneDNN-layout tensor: it only ever flows from the constant graph into that extern.

Which linears: `F.linear(x, w, b)` (nn.Linear) with `w` a constant float32 [N, K] weight of at
least MIN_WEIGHT elements, and GPT-2's Conv1D, `torch.addmm(b, x, w)` with a constant [K, N]
weight (packed from its transposed view `w.t()`, no copy), `b` absent or a constant, every
input on the CPU, only when `torch.backends.mkl.is_available()`.

Consumes: the torch-level graph being frozen and its set of constant nodes (both changed in
place). Produces: how many linears now use packed weights.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..logging import get_logger

perf_log = get_logger("perf")

MKL_LINEAR = torch.ops.mkl._mkl_linear.default
MKL_PACK = torch.ops.mkl._mkl_reorder_linear_weight.default
#: When packing pays (benchmarks/mkl_linear_threshold.py, 1 thread, docs/design/024 and 041):
#: for 4 <= M <= 8 the packed GEMM was at least as fast as addmm on every shape measured (0.77M
#: to 38M weights, 1.0-1.5x); for M < 4 only when the output is wide (N >= 2K: 1.0-1.7x; with
#: N <= K it lost, down to 0.57x at K=3072, N=768, M=1). From 16 to 1024 rows it won by 5-15%
#: in thread CPU time (K, N in 384..3072, both weight layouts); at 1500-2048 rows it was even.
MAX_ROWS = 1024
WIDE_ROWS = 4               # under this many rows, pack only wide outputs (N >= WIDE * K)
WIDE = 2
#: smaller weights (elements) are not packed: MKL's packed buffer has a fixed part of about
#: 6 MB, which dwarfs a small weight, and a small GEMM is mostly call overhead either way
MIN_WEIGHT = 1 << 18


def pays(m: int, n: int, k: int) -> bool:
    """Whether an [M, K] x [K, N] GEMM is packed (see MAX_ROWS)."""
    return n * k >= MIN_WEIGHT and 1 <= m <= MAX_ROWS and (m >= WIDE_ROWS or n >= WIDE * k)


def _val(node):
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def _f32(t, dim) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() == dim


def _linear(node: fx.Node, consts: set):
    """(x, w, b, transposed) for `F.linear(x, w, b)` with a constant float32 [N, K] weight
    (transposed False), or `torch.addmm(b, x, w)` with a 2-D x and a constant [K, N] weight
    (True, GPT-2's Conv1D); else None."""
    if node.op != "call_function":
        return None
    if node.target is F.linear and 2 <= len(node.args) + len(node.kwargs) <= 3 and \
            set(node.kwargs) <= {"bias"}:
        x, w, *rest = node.args
        b, transposed = rest[0] if rest else node.kwargs.get("bias"), False
    elif node.target is torch.addmm and len(node.args) == 3 and not node.kwargs:
        (b, x, w), transposed = node.args, True
        if b is None or not isinstance(_val(x), torch.Tensor) or _val(x).dim() != 2:
            return None
    else:
        return None
    xv = _val(x)
    if w not in consts or not isinstance(xv, torch.Tensor) or xv.dtype != torch.float32 or \
            not _f32(_val(w), 2) or b is not None and (b not in consts or not _f32(_val(b), 1)):
        return None
    return x, w, b, transposed


#: resident bytes of a pack per byte of its weight (RSS growth over 10 packs in a fresh
#: process: 1.55x at M=1, 1.03-1.13x at M >= 8 for 0.26M-2.4M weights). The pack tensor's own
#: numel is what MKL reserves (2.2x to 5x the weight), mostly never touched.
PACK_OVERHEAD_FEW_ROWS = 1.6
PACK_OVERHEAD = 1.15


def packed_bytes(n: int, k: int, m: int) -> int:
    """Resident bytes of an [n, k] float32 weight packed for m rows (the memory budget's
    count)."""
    return int(4 * n * k * (PACK_OVERHEAD_FEW_ROWS if m < 8 else PACK_OVERHEAD))


def prepack_linears(gm: fx.GraphModule, example_inputs, consts: set, options: dict,
                    budget: float) -> int:
    """Rewrite the linears with a constant weight where packing pays to MKL's packed GEMM (in
    place; the pack nodes join `consts`), in graph order while their packed weights fit in
    `budget` bytes (`options={"prepack": True}`: all of them). How many were rewritten."""
    choice = options.get("prepack", "auto")
    if choice not in ("auto", True, False):
        raise ValueError(f"options prepack must be 'auto', True or False, got {choice!r}")
    if choice is False or not torch.backends.mkl.is_available() or \
            any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):
        return 0
    g, done, skipped, packs = gm.graph, 0, 0, {}
    for node in list(g.nodes):
        found = _linear(node, consts)
        if found is None:
            continue
        x, w, b, transposed = found
        xv, (n, k) = _val(x), _val(w).shape[::-1] if transposed else _val(w).shape
        if xv.dim() < 1 or any(not isinstance(s, int) for s in xv.shape):
            continue
        m = math.prod(xv.shape[:-1])
        if not pays(m, n, k):
            continue
        packed = packs.get((w, m, transposed))  # a weight used twice is packed once
        if packed is None:
            if choice is not True and packed_bytes(n, k, m) > budget:
                skipped += 1
                continue
            budget -= packed_bytes(n, k, m)
            with g.inserting_before(node):      # before its first user
                if transposed:                  # a [K, N] weight: its [N, K] view
                    w = _transposed(g, w, consts)
                packed = packs[found[1], m, transposed] = g.call_function(MKL_PACK, (w, m))
            packed.meta["example_value"] = torch.empty(0, device="meta")  # opaque, never traced
            packed.meta["resident_bytes"] = packed_bytes(n, k, m)       # freeze.new_bytes
            consts.add(packed)
        elif transposed:
            w = packed.args[0]
        with g.inserting_before(node):
            new = g.call_function(MKL_LINEAR, (x, packed, w, b, m))
        new.meta["example_value"] = _val(node)
        node.replace_all_uses_with(new)
        g.erase_node(node)
        done += 1
    if done:
        g.lint()
        gm.recompile()
        perf_log.info("prepack: %d linears use MKL-packed weights", done)
    if skipped:
        perf_log.info("prepack: %d linears not packed: over the memory budget (options "
                      "prepack=True packs them anyway)", skipped)
    return done


def _transposed(g: fx.Graph, w: fx.Node, consts: set) -> fx.Node:
    """A constant node `w.t()`: the [N, K] view of a [K, N] weight, for MKL's pack."""
    t = g.call_function(torch.t, (w,))
    t.meta["example_value"] = _val(w).t()
    consts.add(t)
    return t
