"""Stage 3, decomp: aten → primitive aten ops.

Consumes aten ops as the aot tracer sees them (after autograd, so CompositeImplicitAutograd ops
are already gone), produces calls to `PRIMS` (see prims.py). `DECOMPS` maps an OpOverload to a
function with the op's signature, written with `torch.ops.aten.*` calls; the tracer runs it in
its dispatch mode, so the body is recorded and decomposed again, recursively.

Contract with the tracer:
- a decomposition may return `NotImplemented` for an input it does not cover (an awkward
  argument combination); the tracer then records the original op, which the kernel backend
  runs as an extern aten call;
- decompositions of mutating ops (`add_`, `bernoulli_`, batch norm's running stats, optimizer
  `_foreach_*_`) write with `aten.copy_`, which the functionalizer handles.

Family modules: activations, softmax, norms, losses, pointwise, reductions, shapes, creation
(factories, random, dropout), indexing (embedding, index_*), linalg, pooling, upsample, foreach,
and inplace (generated in-place twins, last).
"""
from __future__ import annotations

from . import (activations, creation, foreach, indexing, linalg, losses, norms,  # noqa: F401
               pointwise, pooling, reductions, shapes, softmax, upsample)
from . import inplace  # noqa: F401  (last: derives in-place twins from the table above)
from .prims import PRIM_KINDS, PRIMS, prim_kind
from .registry import DECOMPS, register


def get_decompositions() -> dict:
    """A fresh copy of the decomposition table (OpOverload → fn)."""
    return dict(DECOMPS)


__all__ = ["DECOMPS", "PRIMS", "PRIM_KINDS", "prim_kind", "register", "get_decompositions"]
