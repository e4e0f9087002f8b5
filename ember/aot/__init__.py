"""Stage 2, aot: torch-level FX graph → functional aten forward/backward graphs.

Consumes a torch-level fx.GraphModule (capture/Dynamo) and example inputs (real or FakeTensors;
only shape/stride/dtype/device/requires_grad are read). Produces a callable running the graphs a
kernel compiler built from the aten graphs this stage traced (docs/design/001-stage-contracts.md):
  tracer.py       dispatch-mode tracer over meta tensors, functionalizing as it records
  functionalize.py  per-op tables: functional forms of mutating ops, view scatter rules
  joint.py        forward / joint forward+backward tracing, output aliasing plan
  partition.py    default and min-cut partitioners
  runtime.py      autograd.Function runtime, input mutations, alias rebuilding
  subclass.py     tensor subclasses flattened into their inner tensors at the graph boundary
"""
from __future__ import annotations

import time

import torch
import torch.fx as fx

from .. import debug
from ..logging import get_logger
from .joint import Traced, trace_program
from .partition import partition
from .runtime import InferenceRuntime, TrainingRuntime
from .subclass import SubclassRuntime, desugar
from .foreign import ForeignShapes, ValueSpecialized, adopt, guard_check, is_foreign, scalar_reads
from .tracer import graph_device, specs_of



def _module(graph: fx.Graph, device: torch.device, name: str) -> fx.GraphModule:
    gm = fx.GraphModule(torch.nn.Module(), graph, class_name=name)
    gm.meta["device"] = device
    return gm


def trace_aten(fn, args, decompositions=None, device=None) -> fx.GraphModule:
    """Trace `fn(*args)` to a functional aten graph (inference, no grad).

    Placeholders are `args` (then lifted constants, listed in gm.meta["constants"]); the output
    tuple is fn's flattened tensor outputs followed by the new values of mutated inputs
    (gm.meta["mutated_inputs"] lists their positions). `device`: the graph's device when `args`
    do not tell it (meta tensors).
    """
    traced = trace_program(fn, specs_of(args), decompositions=decompositions,
                           device=device or graph_device(args), joint=False, plan_aliases=False)
    gm = _module(traced.graph, traced.device, "EmberAten")
    gm.meta["constants"] = traced.constants
    gm.meta["mutated_inputs"] = traced.mutated
    return gm


def aot_compile(gm, example_inputs, *, fw_compiler, bw_compiler=None, decompositions=None,
                partitioner="min_cut"):
    """See docs/design/001-stage-contracts.md (backends → aot)."""
    kw = dict(fw_compiler=fw_compiler, bw_compiler=bw_compiler, decompositions=decompositions,
              partitioner=partitioner)
    reads = scalar_reads(gm) if isinstance(gm, fx.GraphModule) else []
    if reads:                     # `y.item()` of an input: a variant per value (foreign.py)
        return ValueSpecialized(gm, reads, lambda g, inputs: aot_compile(g, inputs, **kw))
    if isinstance(gm, fx.GraphModule) and is_foreign(gm, example_inputs):
        def build(inputs):        # Dynamo's dynamic shapes, on ember's shape env (foreign.py)
            env, specs, ex, sources = adopt(gm, inputs)
            runtime = _compile(gm, ex, specs, **kw)
            check = guard_check(env, sources)
            env.frozen = True    # a later size decision (lazy backward) is refused, not unchecked
            return check, runtime
        return ForeignShapes(build).add(*build(list(example_inputs)))
    sub = desugar(gm, example_inputs)
    if sub is not None:           # tensor subclasses: flattened at the boundary (subclass.py)
        prog, flat = sub
        return SubclassRuntime(_compile(prog, flat, specs_of(flat), **kw), prog)
    specs = specs_of(example_inputs, gm if isinstance(gm, fx.GraphModule) else None)
    return _compile(gm, example_inputs, specs, **kw)


def _compile(gm, example_inputs, specs, **kw):
    with debug.graph_scope():       # aot called on its own dumps too; inside a backend: its folder
        return _compile_in_scope(gm, example_inputs, specs, **kw)


def _compile_in_scope(gm, example_inputs, specs, *, fw_compiler, bw_compiler, decompositions,
                      partitioner):
    start = time.perf_counter()
    device = graph_device(example_inputs)
    joint = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    traced = trace_program(gm, specs, decompositions=decompositions, device=device, joint=joint)
    if joint and not traced.grad_inputs:
        traced = trace_program(gm, specs, decompositions=decompositions, device=device, joint=False)
        joint = False
    if not joint:
        fw_gm = _module(traced.graph, device, "EmberForward")
        # its last outputs are copied into these inputs after each call (InferenceRuntime): the
        # kernel compiler may compute them in those inputs' memory (codegen/wrapper.py)
        fw_gm.meta["copied_back"] = traced.mutated
        _log_graph("forward (inference)", fw_gm, start)
        fw = fw_compiler(fw_gm, list(example_inputs) + list(traced.constants))
        return InferenceRuntime(traced, fw, traced.treespec)
    part = partition(traced.graph, n_primals=traced.n_inputs + len(traced.constants),
                     n_fw_outputs=traced.n_fw_outputs, policy=partitioner,
                     mutated=frozenset(traced.mutated))
    fw_gm = _module(part.fw, device, "EmberForward")
    bw_gm = _module(part.bw, device, "EmberBackward")
    _log_graph("forward", fw_gm, start)
    _log_graph("backward", bw_gm, start)
    fw = fw_compiler(fw_gm, list(example_inputs) + list(traced.constants))
    return TrainingRuntime(traced, part, fw, bw_compiler or fw_compiler, bw_gm, traced.treespec)


def _log_graph(what: str, gm: fx.GraphModule, start: float) -> None:
    log = get_logger("aot")
    n = sum(1 for x in gm.graph.nodes if x.op == "call_function")
    header = f"# after aot: {what} graph, {n} ops, took {(time.perf_counter() - start) * 1e3:.1f} ms"
    if log.isEnabledFor(20):
        log.info("%s", header)
    if debug.active():
        debug.dump(f"aot_{what.split()[0]}", f"{header}\nimport torch\nfrom torch import device\n"
                   f"{gm.print_readable(print_output=False)}\n", summary=None, of=gm)


__all__ = ["aot_compile", "trace_aten", "Traced", "partition"]
