"""Stage 2, aot: torch-level FX graph → functional aten forward/backward graphs (placeholder)."""


def aot_compile(gm, example_inputs, *, fw_compiler, bw_compiler=None, decompositions=None,
                partitioner="min_cut"):
    raise NotImplementedError("ember.aot is not implemented yet")
