"""Stage 3, decomp: the decomposition table.

`DECOMPS[aten_overload] = fn`: fn has the op's signature and is written with `torch.ops.aten.*`
calls, so when the aot tracer runs it inside its dispatch mode the body is recorded (and decomposed
again, recursively, until only PRIMS or ops without an entry remain). Family modules fill the table
with `@register(aten.gelu.default)` at import time.
"""
from __future__ import annotations

import torch

DECOMPS: dict = {}


def register(*ops):
    """Register fn as the decomposition of each op (an OpOverload, or an OpOverloadPacket meaning
    all of its overloads)."""
    def deco(fn):
        for op in ops:
            overloads = ([getattr(op, name) for name in op.overloads()]
                         if isinstance(op, torch._ops.OpOverloadPacket) else [op])
            for ov in overloads:
                assert ov not in DECOMPS, f"duplicate decomposition for {ov}"
                DECOMPS[ov] = fn
        return fn
    return deco
