"""Stage 4, lower: aten prim graph → loop IR → kernels (placeholder)."""


def compile_aten_graph(gm, example_inputs, *, options=None):
    raise NotImplementedError("ember.lower is not implemented yet")
