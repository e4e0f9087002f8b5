"""Backend "ember": which GEMMs of a compiled (unfrozen) graph run on oneDNN instead of aten.

Training graphs (aot's forward and backward) and inference graphs that are not frozen keep their
weights as graph inputs, which change every step: no packing (prepack.py is for frozen graphs).
Their GEMMs reach the lowering as 2-D `mm` / `addmm` (a 3-D linear is a view, an mm and a view),
which aten runs on MKL's sgemm. On a core where oneDNN's kernels are the faster ones (gemmlib's
probe: oneDNN on the plain weight beat addmm by its margin) the lowering calls oneDNN's linear
on the plain operands instead, `mkldnn._linear_pointwise(a, b.t(), bias)` (lower/rules_data.py
decides which operand layouts it takes without a copy), for a GEMM where oneDNN's ~10 us fixed
cost is paid back: at least prepack.PLAIN_ROWS rows and prepack.MIN_WORK multiply-adds. Frozen
linears also take a large weight with less work (prepack.onednn_pays); without a pack that
clause did not pay: 16-64 x 768 x 768 ran 0.95-1.03x aten in the forward form (benchmarks/
gemm_train_micro.py, docs/design/076), while from 2^25 multiply-adds both the forward and the
input-gradient forms ran 1.03-1.7x.

`options={"gemm": "mkl"}` (or torch.backends.mkldnn.enabled = False) keeps aten; the probe runs
at the first GEMM that passes the size rule, not for graphs without one.

Consumes: options. Produces: a rule `(m, k, n) -> bool` for the lowering (GraphLowering's
`onednn_gemm`), or None when the graph runs on another device.
"""
from __future__ import annotations

from typing import Callable

from . import gemmlib, prepack


def onednn_gemm_rule(options: dict) -> Callable[[int, int, int], bool]:
    """Whether an [M, K] x [K, N] float32 CPU GEMM runs on oneDNN (module docstring)."""
    verdict: list[bool] = []        # the probe's, asked once, when first needed

    def rule(m: int, k: int, n: int) -> bool:
        if m < prepack.PLAIN_ROWS or m * k * n < prepack.MIN_WORK:
            return False
        if not verdict:
            verdict.append(gemmlib.choice(options).plain)
        return verdict[0]
    return rule
