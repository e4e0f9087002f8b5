"""Graphs with data-dependent sizes from another capture, split where the data is read.

Dynamo (capture_dynamic_output_shape_ops, capture_scalar_outputs) hands a backend graphs in which
an op's output size or a Python scalar depends on tensor values: nonzero, masked_select, boolean
indexing, unique, `.item()` of a computed tensor. It marks each such node with
meta["unbacked_bindings"]. ember traces on meta tensors, which cannot size them, so the graph is
split there (torch.fx's split_module): each data-dependent op, and the scalar code Dynamo emits on
its result (size asserts, `torch._check`), runs as written between compiled segments. A segment is
compiled by the backend at its first call, from the values it receives: a size that depended on
data is a size symbol of its inputs there (aot/foreign.py adopts it as it adopts Dynamo's dynamic
sizes), read at run time, so a later call with another count reuses the same kernels.

A graph whose only data reads are `.item()` of its inputs is left to aot's per-value variants
(aot/foreign.py), which fold Dynamo's asserts at compile time.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from ..aot.foreign import scalar_reads
from ..errors import Unsupported
from ..fallback import fall_back


def _value(n: fx.Node):
    return n.meta.get("example_value", n.meta.get("val"))


def data_dependent(gm) -> bool:
    if not isinstance(gm, fx.GraphModule):
        return False
    reads = set(scalar_reads(gm))
    return any(n.op != "placeholder" and n.meta.get("unbacked_bindings") and n not in reads
               for n in gm.graph.nodes)


def _stages(gm: fx.GraphModule) -> dict:
    """Node -> stage: odd stages run as written (a data-dependent op, scalar code on its
    result), even stages are compiled; each node goes to the earliest stage its inputs allow."""
    stage, tainted = {}, set()
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        first = max((stage.get(a, 0) for a in n.all_input_nodes), default=0)
        as_written = bool(n.meta.get("unbacked_bindings")) or (
            any(a in tainted for a in n.all_input_nodes)
            and not isinstance(_value(n), torch.Tensor))
        if as_written:
            tainted.add(n)
        stage[n] = first + (first % 2 == 0) if as_written else first + first % 2
    return stage


class _Segment(torch.nn.Module):
    """A compiled stage: built by `compile_fn(gm, inputs)` at the first call."""

    def __init__(self, gm: fx.GraphModule, compile_fn):
        super().__init__()
        self.gm, self.compile_fn, self.run = gm, compile_fn, None

    def forward(self, *args):
        if self.run is None:
            try:
                for p in self.gm.graph.find_nodes(op="placeholder"):
                    if isinstance(_value(p), (torch.SymFloat, torch.SymBool)):
                        raise Unsupported(f"a data-dependent {type(_value(p)).__name__} "
                                          f"({p.name}) feeds this part of the graph: compiled, "
                                          "it would keep its first value")
                self.run = self.compile_fn(self.gm, list(args))
            except Exception as exc:  # noqa: BLE001 - the fallback policy
                fall_back("ember", exc, "this part of a graph split at a data-dependent op")
                self.run = self.gm
        return self.run(*args)


def split_at_data(gm: fx.GraphModule, compile_fn) -> fx.GraphModule:
    """`gm` split into stages run as written and `_Segment`s compiled lazily by `compile_fn`."""
    stage = _stages(gm)
    parts = split_module(gm, None, lambda n: stage[n])
    for name, sub in list(parts.named_children()):
        if int(name.rsplit("_", 1)[1]) % 2 == 0:
            setattr(parts, name, _Segment(sub, compile_fn))
    return parts
