"""Backend "ember" (the default): capture → aot → decomps → loop IR, fusion, generated kernels."""
from __future__ import annotations

from .. import counters
from ..aot import aot_compile
from ..decomp import get_decompositions
from ..lower import compile_aten_graph


def ember_backend(gm, example_inputs, **kwargs):
    options = kwargs.get("options") or {}

    def compiler(g, ex):            # forward now, backward lazily at the first backward
        with counters.timed("codegen"):
            return compile_aten_graph(g, ex, options=options)
    with counters.timed("aot"):
        return aot_compile(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler,
                           decompositions=get_decompositions())
