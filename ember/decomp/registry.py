"""Stage 3, decomp: the decomposition table.

`DECOMPS[aten_overload] = fn`: fn has the op's signature and is written with `torch.ops.aten.*`
calls, so when the aot tracer runs it inside its dispatch mode the body is recorded (and decomposed
again, recursively, until only PRIMS or ops without an entry remain). Family modules fill the table
with `@register(aten.gelu.default)` at import time.
"""
from __future__ import annotations

import functools

import torch

DECOMPS: dict = {}


def _has_complex(args, kwargs) -> bool:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.is_complex():
                return True
        elif isinstance(a, (list, tuple)):
            if any(isinstance(t, torch.Tensor) and t.is_complex() for t in a):
                return True
    return False


def _real_only(fn):
    """Decompositions are written for real dtypes: with a complex tensor argument they decline
    (NotImplemented), and the op stays an aten call."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _has_complex(args, kwargs):
            return NotImplemented
        return fn(*args, **kwargs)
    wrapper.decomposition = fn
    return wrapper


def register(*ops):
    """Register fn as the decomposition of each op (an OpOverload, or an OpOverloadPacket meaning
    all of its overloads). The table holds fn wrapped by `_real_only`; the function itself is
    returned unchanged."""
    def deco(fn):
        entry = _real_only(fn)
        for op in ops:
            overloads = ([getattr(op, name) for name in op.overloads()]
                         if isinstance(op, torch._ops.OpOverloadPacket) else [op])
            for ov in overloads:
                assert ov not in DECOMPS, f"duplicate decomposition for {ov}"
                DECOMPS[ov] = entry
        return fn
    return deco
