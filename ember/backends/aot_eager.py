"""Backend "aot_eager": capture → aot (functionalize, joint fwd+bwd, partition) → decomps,
then run the aten graphs with PyTorch's eager kernels."""
from __future__ import annotations

from ..aot import aot_compile
from ..decomp import get_decompositions


def _run_as_is(gm, example_inputs):
    return gm.forward


def aot_eager(gm, example_inputs):
    return aot_compile(gm, example_inputs, fw_compiler=_run_as_is, bw_compiler=_run_as_is,
                       decompositions=get_decompositions())
