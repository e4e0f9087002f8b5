"""Backend "ember", freezing: MKL-packed weights for small-batch linears in frozen graphs.

In a frozen inference graph (freeze.py) a linear whose weight is a constant and whose row count
M (the product of the input's leading sizes, static in the graph) is small (`pays`) becomes

    mkl._mkl_linear(x, packed, w, b, M)     packed = mkl._mkl_reorder_linear_weight(w, M)

with `packed` computed in the constant graph: once at freeze time, again at each refold (the
packed tensor is a folded constant like any other). MKL's packed GEMM skips the per-call weight
packing that `addmm` does, which is most of the work when M is small (decode, batch-1
inference); measured by benchmarks/mkl_linear_threshold.py (docs/design/024). Called with
another row count, `_mkl_linear` itself falls back to a plain GEMM on the original weight.

The op has a meta kernel, so aot traces it; lower runs it as a fallback extern. `packed` is an
opaque oneDNN-layout tensor: it only ever flows from the constant graph into that extern.

Which linears: `F.linear(x, w, b)` (nn.Linear) with `w` a constant float32 [N, K] weight of at
least MIN_WEIGHT elements, `b` absent or a constant, every input on the CPU, only when
`torch.backends.mkl.is_available()`. Not GPT-2's Conv1D (`addmm(b, x, w)` with a [K, N]
weight): measured, addmm on that layout is as fast as the packed GEMM already.

Consumes: the torch-level graph being frozen and its set of constant nodes (both changed in
place). Produces: how many linears now use packed weights.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..logging import get_logger

perf_log = get_logger("perf")

MKL_LINEAR = torch.ops.mkl._mkl_linear.default
MKL_PACK = torch.ops.mkl._mkl_reorder_linear_weight.default
#: When packing pays (benchmarks/mkl_linear_threshold.py, 1 thread, docs/design/024): for
#: 4 <= M <= 8 the packed GEMM was at least as fast as addmm on every shape measured (0.77M to
#: 38M weights, 1.0-1.5x); for M < 4 only when the output is wide (N >= 2K: 1.0-1.7x; with
#: N <= K it lost, down to 0.57x at K=3072, N=768, M=1); over 8 rows the gain fades.
MAX_ROWS = 8
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
    """(x, w, b) for `F.linear(x, w, b)` with a constant float32 [N, K] weight, or None."""
    if node.op != "call_function" or node.target is not F.linear or \
            not 2 <= len(node.args) + len(node.kwargs) <= 3 or not set(node.kwargs) <= {"bias"}:
        return None
    x, w, *rest = node.args
    b = rest[0] if rest else node.kwargs.get("bias")
    xv = _val(x)
    if w not in consts or not isinstance(xv, torch.Tensor) or xv.dtype != torch.float32 or \
            not _f32(_val(w), 2) or b is not None and (b not in consts or not _f32(_val(b), 1)):
        return None
    return x, w, b


@functools.lru_cache(maxsize=256)
def packed_bytes(n: int, k: int, m: int) -> int:
    """Bytes MKL allocates for an [n, k] weight packed for m rows (from 1.5x the weight for a
    large one to megabytes for a tiny one); found by packing zeros once per shape."""
    p = MKL_PACK(torch.zeros(n, k), m)
    return p.numel() * p.element_size()


def prepack_linears(gm: fx.GraphModule, example_inputs, consts: set, options: dict,
                    budget: float) -> int:
    """Rewrite small-M linears with a constant weight to MKL's packed GEMM (in place; the pack
    nodes join `consts`), in graph order while their packed weights fit in `budget` bytes
    (`options={"prepack": True}`: all of them). How many were rewritten."""
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
        x, w, b = found
        xv, (n, k) = _val(x), _val(w).shape
        if not 1 <= xv.dim() <= 3 or any(not isinstance(s, int) for s in xv.shape):
            continue
        m = math.prod(xv.shape[:-1])
        if not pays(m, n, k):
            continue
        packed = packs.get((w, m))              # a weight used twice is packed once
        if packed is None:
            if choice is not True and packed_bytes(n, k, m) > budget:
                skipped += 1
                continue
            budget -= packed_bytes(n, k, m)
            with g.inserting_before(node):      # before its first user
                packed = packs[w, m] = g.call_function(MKL_PACK, (w, m))
            packed.meta["example_value"] = torch.empty(0, device="meta")  # opaque, never traced
            consts.add(packed)
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
