"""Stage 3, decomp: aten → primitive aten ops.

Consumes aten ops as the aot tracer sees them (after autograd, so CompositeImplicitAutograd ops
are already gone), produces calls to `PRIMS` (see prims.py). `DECOMPS` maps an OpOverload to a
function with the op's signature; the tracer applies it recursively.
"""
from __future__ import annotations

from .prims import PRIM_KINDS, PRIMS, prim_kind
from .registry import DECOMPS, register


def get_decompositions() -> dict:
    """A fresh copy of the decomposition table (OpOverload → fn)."""
    return dict(DECOMPS)


__all__ = ["DECOMPS", "PRIMS", "PRIM_KINDS", "prim_kind", "register", "get_decompositions"]
