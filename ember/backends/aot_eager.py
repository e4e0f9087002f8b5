"""Backend "aot_eager": capture → aot (functionalize, joint fwd+bwd, partition) → decomps,
then run the aten graphs with PyTorch's eager kernels.

This backend is the correctness reference for aot against eager, so random ops stay eager
kernels (their decompositions draw numbers differently): with a fixed seed, dropout masks are
bitwise those of eager PyTorch.
"""
from __future__ import annotations

import torch

from ..aot import aot_compile
from ..decomp import get_decompositions


def _run_as_is(gm, example_inputs):
    return gm.forward


def eager_rng_decompositions() -> dict:
    return {op: fn for op, fn in get_decompositions().items()
            if torch.Tag.nondeterministic_seeded not in op.tags}


def aot_eager(gm, example_inputs, **kwargs):
    options = kwargs.get("options") or {}
    return aot_compile(gm, example_inputs, fw_compiler=_run_as_is, bw_compiler=_run_as_is,
                       decompositions=eager_rng_decompositions(),
                       partitioner=options.get("partitioner", "min_cut"))
