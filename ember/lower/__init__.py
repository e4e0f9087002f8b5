"""Stage 4, lower: aten prim graph → loop IR → (schedule, codegen, runtime) → callable.

Entry point: `compile_aten_graph(gm, example_inputs, *, options=None)`.
"""
from .compile import STATS, compile_aten_graph

__all__ = ["compile_aten_graph", "STATS"]
