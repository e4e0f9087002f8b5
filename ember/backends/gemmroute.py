"""Backend "ember": which GEMMs of a compiled (unfrozen) graph run on oneDNN instead of aten.

Training graphs (aot's forward and backward) and inference graphs that are not frozen keep their
weights as graph inputs, which change every step: no packing (prepack.py is for frozen graphs).
Their GEMMs reach the lowering as 2-D `mm` / `addmm` (a 3-D linear is a view, an mm and a view),
which aten runs on MKL's sgemm. On a core where oneDNN's kernels are the faster ones (gemmlib's
probe: oneDNN on the plain weight beat addmm by its margin) the lowering calls oneDNN's linear
on the plain operands instead, `mkldnn._linear_pointwise(a, b.t(), bias)` (lower/rules_data.py
decides which operand layouts it takes without a copy), for a GEMM where oneDNN's ~10 us fixed
cost is paid back: the rule of frozen linears left without a pack, prepack.plain_pays (at least
PLAIN_ROWS rows, and PLAIN_MIN_WEIGHT weight elements or MIN_WORK multiply-adds; docs/design/
076, 081). A first operand stored column-major (the weight gradient) costs oneDNN a copy: it
goes only with a wide output (TRANSPOSED_MIN_N) and MIN_WORK multiply-adds.

`options={"gemm": "mkl"}` (or torch.backends.mkldnn.enabled = False) keeps aten; the probe runs
at the first GEMM that passes the size rule, not for graphs without one.

The rule's answers change the compiled code, so `decisions(gm, rule)` (the answer for each
GEMM of the graph) is part of the graph cache's key: a graph compiled under one probe verdict,
`gemm` option or mkldnn switch is not served where the rule now answers otherwise.

Consumes: options; the aten graph (for the cache key). Produces: a rule `(m, k, n) -> bool`
for the lowering (GraphLowering's `onednn_gemm`), or None when the graph runs on another
device; the rule's decisions for a graph.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import gemmlib, prepack

#: oneDNN's linear copies a first operand stored column-major (the weight gradient's g.t() @ x)
#: to row-major first: M*K elements for M*K*N multiply-adds. That paid from N >= 1024 output
#: columns: aten/oneDNN 1.01-1.13 at N 1024..4096 (M 384..4096, K 512 and 2048), 0.92-1.01 at N
#: 384 and 768 (benchmarks/gemm_train_micro.py, form gw; docs/design/081)
TRANSPOSED_MIN_N = 1024
#: the aten GEMMs the lowering may route (lower/rules_data._onednn_gemm)
GEMMS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def onednn_gemm_rule(options: dict) -> Callable[..., bool]:
    """Whether an [M, K] x [K, N] float32 CPU GEMM runs on oneDNN (module docstring);
    `transposed`: its first operand is stored column-major."""
    verdict: list[bool] = []        # the probe's, asked once, when first needed

    def rule(m: int, k: int, n: int, transposed: bool = False) -> bool:
        if not prepack.plain_pays(m, n, k) or \
                transposed and (n < TRANSPOSED_MIN_N or m * k * n < prepack.MIN_WORK):
            return False
        if not verdict:
            verdict.append(gemmlib.choice(options).plain)
        return verdict[0]
    return rule


def decisions(gm, rule: Callable[..., bool]) -> tuple[tuple[bool, bool], ...]:
    """The rule's answer for each float32 GEMM of the aten graph `gm` with static sizes, in
    graph order (empty: nothing the rule decides; the probe is not asked)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in GEMMS:
            continue
        a, b = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None
                for x in node.args[-2:])
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or \
                a.dtype != torch.float32 or a.dim() != 2 or b.dim() != 2:
            continue
        (m, k), n = a.shape, b.shape[1]
        if all(isinstance(s, int) for s in (m, k, n)):      # either layout of the first
            out.append((rule(m, k, n), rule(m, k, n, True)))  # operand (the lowering's)
    return tuple(out)
