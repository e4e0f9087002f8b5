"""A dispatch mode that runs aten ops through `ember.decomp.DECOMPS` on real tensors.

Used to check decompositions against eager without the aot tracer: every op that reaches the
mode is replaced by its decomposition (recursively) and the ops that finally execute are
recorded, so a test can assert they are all PRIMS.
"""
from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..decomp import DECOMPS, PRIMS

# Ops that are bookkeeping, not computation (profiler markers, metadata queries, .item()).
IGNORED = {"profiler", "prim"}
NON_COMPUTE = {
    torch.ops.aten._local_scalar_dense.default, torch.ops.aten.copy_.default,
    torch.ops.aten.lift_fresh.default,
    torch.ops.aten.is_same_size.default, torch.ops.aten.sym_size.int,
    torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
    torch.ops.aten.set_.source_Storage_storage_offset, torch.ops.aten.set_.source_Tensor,
    torch.ops.aten.resize_.default,
}


class DecompMode(TorchDispatchMode):
    def __init__(self, table=None):
        super().__init__()
        self.table = DECOMPS if table is None else table
        self.decomposed = collections.Counter()   # ops replaced by their decomposition
        self.declined = collections.Counter()     # decomposition returned NotImplemented
        self.leaves = collections.Counter()       # ops that ran as aten kernels

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fn = self.table.get(func)
        if fn is not None:
            with self:
                out = fn(*args, **kwargs)
            if out is not NotImplemented:
                self.decomposed[func] += 1
                return out
            self.declined[func] += 1
        if func.namespace not in IGNORED:
            self.leaves[func] += 1
        return func(*args, **kwargs)

    def non_prims(self) -> set:
        """Ops that ran as themselves although they are neither PRIMS nor bookkeeping."""
        return {op for op in self.leaves if op not in PRIMS and op not in NON_COMPUTE}


def run_decomposed(fn, *args, **kwargs):
    """fn(*args, **kwargs) with every aten op decomposed; returns (result, mode)."""
    mode = DecompMode()
    with mode:
        out = fn(*args, **kwargs)
    return out, mode


class CheckingDecompMode(DecompMode):
    """DecompMode that also runs each decomposed op's aten kernel on cloned inputs and records
    the ops whose decomposition disagrees (max abs error above `atol + rtol*|ref|`)."""

    def __init__(self, table=None, rtol=1e-6, atol=1e-9):
        super().__init__(table)
        self.rtol, self.atol = rtol, atol
        self.mismatches = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fn = self.table.get(func)
        if fn is None:
            return super().__torch_dispatch__(func, types, args, kwargs)
        clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
        c_args = torch.utils._pytree.tree_map(clone, args)
        c_kwargs = torch.utils._pytree.tree_map(clone, kwargs)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func in self.decomposed:
            ref = func(*c_args, **c_kwargs)
            got_l = torch.utils._pytree.tree_leaves((out, args))
            ref_l = torch.utils._pytree.tree_leaves((ref, c_args))
            for g, r in zip(got_l, ref_l):
                if isinstance(g, torch.Tensor) and isinstance(r, torch.Tensor) and g.shape == r.shape \
                        and g.dtype.is_floating_point and g.numel():
                    err = (g.double() - r.double()).abs()
                    bad = err > self.atol + self.rtol * r.double().abs()
                    bad &= ~(g.isnan() & r.isnan())
                    if bad.any():
                        self.mismatches.setdefault(func, float(err[bad].max()))
        return out
