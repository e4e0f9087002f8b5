"""Backend "ember", freezing: packed weights for the linears of frozen graphs.

In a frozen inference graph (freeze.py) a linear whose weight is a constant and whose row count
M (the product of the input's leading sizes, static in the graph) is one where packing pays
becomes one of

    mkl._mkl_linear(x, packed, w, b, M)     packed = mkl._mkl_reorder_linear_weight(w, M)
    mkldnn._linear_pointwise(x, packed, b, "none", [], "")
                                            packed = mkldnn._reorder_linear_weight(w, M)

with `packed` computed in the constant graph: once at freeze time, again at each refold (the
packed tensor is a folded constant like any other). Which library: the one gemmlib.py measured
faster on this machine (`gemmlib.choice`). Rules, each from measurements (benchmarks/
mkl_linear_threshold.py and gemm_libs.py, 1 thread, thread CPU time; docs/design/024, 041, 071):

- MKL (`pays`): 1 <= M <= MAX_ROWS, weight >= MIN_WEIGHT elements, and M >= WIDE_ROWS or a
  wide output; it skips the per-call weight packing that `addmm` does. Also the rule at M = 1
  when the library is oneDNN: a GEMV is memory-bound, and MKL's packed one was the faster there.
- oneDNN (`onednn_pays`): M >= 2 and a weight of at least MIN_WEIGHT elements or at least
  MIN_WORK multiply-adds; no upper bound on M. Under that, its per-call overhead (~10 us) loses.
- oneDNN on the plain weight (`plain_pays`, also the rule for unfrozen GEMMs, gemmroute.py):
  M >= PLAIN_ROWS and a weight of at least PLAIN_MIN_WEIGHT elements or at least MIN_WORK
  multiply-adds. A linear whose pack does not fit the freezing budget runs that way (no copy)
  when it pays and the probe found oneDNN on the plain weight faster than addmm.

Called with another row count, `_mkl_linear` falls back to a plain GEMM on the original weight;
oneDNN's pack serves any row count (its M only picks the blocking).

Both ops have meta kernels, so aot traces them; lower runs them as fallback externs. `packed`
is an opaque tensor: it only ever flows from the constant graph into that extern.

Which linears: `F.linear(x, w, b)` (nn.Linear) with `w` a constant float32 [N, K] weight, and
GPT-2's Conv1D, `torch.addmm(b, x, w)` with a constant [K, N] weight (packed from its transposed
view `w.t()`, no copy), `b` absent or a constant, every input on the CPU.

Consumes: the torch-level graph being frozen and its set of constant nodes (both changed in
place). Produces: how many linears now use packed weights.
"""
from __future__ import annotations

import math
from collections import Counter

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..logging import get_logger
from . import gemmlib

perf_log = get_logger("perf")

MKL_LINEAR = torch.ops.mkl._mkl_linear.default
MKL_PACK = torch.ops.mkl._mkl_reorder_linear_weight.default
ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise.default
ONEDNN_PACK = torch.ops.mkldnn._reorder_linear_weight.default
LINEAR_PACKS = (MKL_PACK, ONEDNN_PACK)
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
#: oneDNN (gemm_libs.py on a Zen 4 core, docs/design/071): with a weight under MIN_WEIGHT it lost
#: to addmm up to 8M multiply-adds (0.45-0.95x: 16x128x128, 256x64x64, 1024x64x64, 32x384x384)
#: and won from 29M (197x192x768 1.05x, 3136x96x384 1.12x, 1500x384x384 1.26x)
MIN_WORK = 1 << 25
#: oneDNN on the plain (unpacked) weight: 0.90x addmm at 8x768x768, 1.01-1.44x from 16 rows
PLAIN_ROWS = 16
#: ... with less than MIN_WORK multiply-adds (16-48 rows, benchmarks/gemm_train_micro.py form fwd,
#: docs/design/081): 1.04-1.19x addmm on 2^20-element weights (1024x1024, 512x2048, 2048x512),
#: 0.98-1.04x on 768x768; a pack wins on smaller weights too (MIN_WEIGHT), the plain one does not
PLAIN_MIN_WEIGHT = 1 << 20


def pays(m: int, n: int, k: int) -> bool:
    """Whether an [M, K] x [K, N] GEMM is packed by MKL (see MAX_ROWS)."""
    return n * k >= MIN_WEIGHT and 1 <= m <= MAX_ROWS and (m >= WIDE_ROWS or n >= WIDE * k)


def onednn_pays(m: int, n: int, k: int) -> bool:
    """Whether an [M, K] x [K, N] GEMM runs faster on oneDNN than on addmm (see MIN_WORK)."""
    return m >= 2 and (n * k >= MIN_WEIGHT or m * n * k >= MIN_WORK)


def plain_pays(m: int, n: int, k: int) -> bool:
    """Whether an [M, K] x [K, N] GEMM runs faster on oneDNN with the plain (unpacked) weight
    than on addmm (see PLAIN_MIN_WEIGHT)."""
    return m >= PLAIN_ROWS and (n * k >= PLAIN_MIN_WEIGHT or m * n * k >= MIN_WORK)


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


def packed_bytes(n: int, k: int, m: int, library: str = "mkl") -> int:
    """Resident bytes of an [n, k] float32 weight packed for m rows (the memory budget's
    count). oneDNN's pack is the weight's size (its blocked layout pads nothing at these
    widths; resident-set growth over 10 packs 0.9-1.0x the weight)."""
    if library == "onednn":
        return 4 * n * k
    return int(4 * n * k * (PACK_OVERHEAD_FEW_ROWS if m < 8 else PACK_OVERHEAD))


def prepack_linears(gm: fx.GraphModule, example_inputs, consts: set, options: dict,
                    budget: float) -> tuple[int, int]:
    """Rewrite the linears with a constant weight where packing pays to a packed GEMM (in
    place; the pack nodes join `consts`), in graph order while their packed weights fit in
    `budget` bytes (`options={"prepack": True}`: all of them); a linear left unpacked runs
    oneDNN on its plain weight where that pays. How many were packed, and how many run oneDNN
    on their plain weight."""
    choice = options.get("prepack", "auto")
    if choice not in ("auto", True, False):
        raise ValueError(f"options prepack must be 'auto', True or False, got {choice!r}")
    if choice is False or \
            any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):
        return 0, 0
    g, lib, done, plain, skipped, packs = gm.graph, None, Counter(), 0, 0, {}
    for node in list(g.nodes):
        found = _linear(node, consts)
        if found is None:
            continue
        x, w, b, transposed = found
        xv, (n, k) = _val(x), _val(w).shape[::-1] if transposed else _val(w).shape
        if xv.dim() < 1 or any(not isinstance(s, int) for s in xv.shape):
            continue
        m = math.prod(xv.shape[:-1])
        lib = lib or gemmlib.choice(options)        # measured on the first candidate
        library = _library(lib, m, n, k)
        packed = packs.get((w, m, transposed, library))  # a weight used twice is packed once
        if library is not None and packed is None:
            size = packed_bytes(n, k, m, library)
            if choice is True or size <= budget:
                budget -= 0 if choice is True else size
                with g.inserting_before(node):      # before its first user
                    pw = _transposed(g, w, consts) if transposed else w   # a [K, N] weight
                    packed = packs[w, m, transposed, library] = g.call_function(
                        MKL_PACK if library == "mkl" else ONEDNN_PACK, (pw, m))
                packed.meta["example_value"] = (    # opaque, never traced; oneDNN's meta
                    torch.empty(0, device="meta") if library == "mkl" else _val(pw))  # reads N
                packed.meta["resident_bytes"] = size          # freeze.new_bytes
                consts.add(packed)
            else:
                skipped += 1
        if packed is None and (not lib.plain or not plain_pays(m, n, k)):
            continue
        with g.inserting_before(node):
            if packed is None:                      # oneDNN on the plain weight
                wt = _transposed(g, w, consts) if transposed else w
                new = g.call_function(ONEDNN_LINEAR, (x, wt, b, "none", [], ""))
                plain += 1
            elif library == "mkl":
                wt = packed.args[0] if transposed else w
                new = g.call_function(MKL_LINEAR, (x, packed, wt, b, m))
            else:
                new = g.call_function(ONEDNN_LINEAR, (x, packed, b, "none", [], ""))
            if packed is not None:
                done[library] += 1
        new.meta["example_value"] = _val(node)
        node.replace_all_uses_with(new)
        g.erase_node(node)
    if done or plain:
        g.lint()
        gm.recompile()
        perf_log.info("prepack: %s packed weights, %d linears on oneDNN with the plain weight "
                      "(library %s)", ", ".join(f"{v} linears on {k}" for k, v in
                                                sorted(done.items())) or "no", plain, lib.library)
    if skipped:
        perf_log.info("prepack: %d linears not packed: over the memory budget (options "
                      "prepack=True packs them anyway)", skipped)
    return sum(done.values()), plain


def _library(lib: gemmlib.Choice, m: int, n: int, k: int) -> str | None:
    """Which packed GEMM an [M, K] x [K, N] linear uses, if any (module docstring)."""
    if lib.library == "onednn" and onednn_pays(m, n, k):
        return "onednn"
    if lib.library is not None and torch.backends.mkl.is_available() and pays(m, n, k):
        return "mkl"
    return None


def _transposed(g: fx.Graph, w: fx.Node, consts: set) -> fx.Node:
    """A constant node `w.t()`: the [N, K] view of a [K, N] weight, for MKL's pack."""
    t = g.call_function(torch.t, (w,))
    t.meta["example_value"] = _val(w).t()
    consts.add(t)
    return t
