"""Stage 4, lower: aten prim graph → loop IR (ember.loopir.nodes).

Entry point: `GraphLowering(gm, example_inputs).run()` (lowering.py); the kernel backend's
pipeline that runs it and the stages after it is ember.backends.ember.compile_aten_graph.
"""
