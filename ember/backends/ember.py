"""Backend "ember" (the default): capture → aot → decomps → loop IR, fusion, generated kernels."""
from __future__ import annotations

from .. import counters
from ..aot import aot_compile
from ..fallback import fall_back, stage
from ..decomp import get_decompositions
from ..lower import compile_aten_graph
from .speed import speed_checked


def ember_backend(gm, example_inputs, **kwargs):
    options = kwargs.get("options") or {}

    def compiler(g, ex):            # forward now, backward lazily at the first backward
        with counters.timed("codegen"):
            return compile_aten_graph(g, ex, options=options)

    def bw_compiler(g, ex):
        # runs inside the first backward, past the backend's own fallback: a failure here makes
        # the backward graph run eagerly (its aten ops), the forward stays compiled
        try:
            return compiler(g, ex)
        except Exception as exc:  # noqa: BLE001 - the fallback policy
            fall_back("ember", exc, "this graph's backward")
            return g
    with counters.timed("aot"), stage("aot"):
        compiled = aot_compile(gm, example_inputs, fw_compiler=compiler, bw_compiler=bw_compiler,
                               decompositions=get_decompositions())
    return speed_checked(gm, compiled, example_inputs, options)    # never slower than eager
