"""Shared checks for aot unit tests: graphs follow the aten-graph contract of 001-stage-contracts."""
import operator

import torch
import torch.fx as fx

import ember
import ember.decomp

aten = torch.ops.aten


def check_aten_graph(gm: fx.GraphModule) -> dict:
    """Assert the contract; return {op: count}."""
    assert isinstance(gm.meta.get("device"), torch.device)
    counts: dict = {}
    for n in gm.graph.nodes:
        assert n.op in ("placeholder", "output", "call_function"), n.format_node()
        if n.op == "call_function":
            assert isinstance(n.target, torch._ops.OpOverload) or n.target is operator.getitem, n.target
            if n.target is not operator.getitem:
                assert not n.target._schema.is_mutable, f"mutating op in graph: {n.target}"
                counts[n.target] = counts.get(n.target, 0) + 1
        if n.op == "output":
            assert isinstance(n.args[0], tuple)
        else:
            val = n.meta.get("val")
            assert val is not None, f"no meta['val'] on {n.format_node()}"
            vals = val if isinstance(val, tuple) else (val,)
            for v in vals:
                assert not isinstance(v, torch.Tensor) or v.device.type == "meta"
    return counts


class GraphRecorder:
    """A fw/bw compiler that records the aten graphs and runs them as they are."""

    def __init__(self):
        self.fw: list[fx.GraphModule] = []
        self.bw: list[fx.GraphModule] = []

    def fw_compiler(self, gm, example_inputs):
        check_aten_graph(gm)
        self.fw.append(gm)
        return gm.forward

    def bw_compiler(self, gm, example_inputs):
        check_aten_graph(gm)
        self.bw.append(gm)
        return gm.forward

    def backend(self, partitioner="min_cut"):
        def compile_graph(gm, example_inputs):
            return ember.aot.aot_compile(gm, example_inputs, fw_compiler=self.fw_compiler,
                                         bw_compiler=self.bw_compiler,
                                         decompositions=ember.decomp.get_decompositions(),
                                         partitioner=partitioner)
        return compile_graph
