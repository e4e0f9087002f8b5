"""Stage aot, program tracing: the forward graph (inference) or the joint forward+backward graph
(training) of a torch-level callable.

Consumes: a callable (fx.GraphModule from capture/Dynamo), input specs, a decomposition table.
Produces: `Traced` — one functional aten fx.Graph whose output tuple is
    [output slots] + [new values of mutated inputs] (+ [grads of inputs that get one] when joint),
and the plan the runtime needs to rebuild user outputs (aliasing, identity, duplicates).

The joint graph is forward + `torch.autograd.grad(outputs, inputs, tangents)` traced through the
same mode, so PyTorch's own derivative formulas produce the backward ops; tangents are
placeholders, one per differentiable output slot.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy
import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten

from .. import counters, regions, shapes
from ..errors import Unsupported
from .tracer import (LiftTensorLiterals, OutputSpec, TensorSpec, Tracer, order_placeholders,
                     remove_identity_views)


@dataclasses.dataclass
class Traced:
    graph: fx.Graph
    device: torch.device
    n_inputs: int
    constants: list                    # real tensors, fed after the inputs
    outputs: list[OutputSpec]          # how to build each user output
    n_slots: int                       # graph outputs [0, n_slots) are user-output slots
    slot_requires_grad: list[bool]
    mutated: list[int]                 # graph outputs [n_slots, n_slots+len) → these inputs
    joint: bool = False
    tangent_outs: list[int] = dataclasses.field(default_factory=list)   # fw outputs with a tangent
    tangent_specs: list = dataclasses.field(default_factory=list)
    grad_inputs: list[int] = dataclasses.field(default_factory=list)    # inputs with a grad output
    treespec: object = None            # pytree structure of the user outputs
    symbols: dict = dataclasses.field(default_factory=dict)   # size symbol → (input, dim|None)

    @property
    def n_fw_outputs(self) -> int:
        return self.n_slots + len(self.mutated)


def _plan_outputs(tr: Tracer, flat_outs) -> tuple[list[OutputSpec], list[torch.Tensor]]:
    """Classify user outputs; return their specs and the tensors whose values are graph outputs."""
    specs: list[OutputSpec] = []
    slot_tensors: list[torch.Tensor] = []
    slot_of_root: dict[int, int] = {}
    first_index: dict[int, int] = {}

    def slot(root: torch.Tensor) -> int:
        if id(root) not in slot_of_root:
            slot_of_root[id(root)] = len(slot_tensors)
            slot_tensors.append(root)
        return slot_of_root[id(root)]

    for i, o in enumerate(flat_outs):
        if not isinstance(o, torch.Tensor):
            specs.append(OutputSpec("const", value=o))
            continue
        rg = bool(o.requires_grad)
        if id(o) in first_index:
            specs.append(OutputSpec("dup", index=first_index[id(o)], requires_grad=rg))
            continue
        first_index[id(o)] = i
        root, chain = tr.view_chain(o)
        index = tr.input_index_of(o)
        if index is not None and root is tr.inputs[index]:
            if not chain and o is root:
                specs.append(OutputSpec("input", index=index, requires_grad=rg))
            else:
                specs.append(OutputSpec("view", index=index, views=chain, requires_grad=rg))
        elif chain and (root.requires_grad or not rg) and \
                not isinstance(o.grad_fn, torch.autograd.function.BackwardCFunction):
            specs.append(OutputSpec("view", slot=slot(root), views=chain, requires_grad=rg))
        elif chain:
            # a view made inside a decomposition, or returned by an autograd.Function (capture's
            # hook Functions return views): rebuilding the output from the root would drop that
            # backward (or the root's never reached autograd); the output is a graph value itself
            specs.append(OutputSpec("graph", slot=slot(o), requires_grad=rg))
        else:
            specs.append(OutputSpec("graph", slot=slot(o if root is o else root), requires_grad=rg))
    return specs, slot_tensors


def trace_program(fn: Callable, specs: list, *, decompositions: dict | None, device: torch.device,
                  joint: bool, plan_aliases: bool = True) -> Traced:
    """Trace `fn` on meta inputs built from `specs`. With plan_aliases=False every user output is
    its own graph output (trace_aten: a kernel compiler's view, no runtime alias rebuilding)."""
    tr = Tracer(decompositions, device)
    regions.reset()
    inputs = [tr.add_input(f"arg{i}", s) for i, s in enumerate(specs)]
    grad_mode = torch.enable_grad() if joint else torch.no_grad()
    with grad_mode, tr, LiftTensorLiterals(tr):
        try:
            # a GraphModule's forward, not its __call__: global module hooks must not see it
            out = (fn.forward if isinstance(fn, torch.nn.Module) else fn)(*inputs)
        except RuntimeError as e:
            if "leaf Variable that requires grad" not in str(e):
                raise
            # the traced inputs are leaves; the real one may be a non-leaf that eager lets
            # a view of be mutated (autograd records it). Not modelled: refuse, never guess
            raise Unsupported("ember.aot: in-place mutation of (a view of) a graph input that "
                              "requires grad (Inductor's test_input_mutation2)") from e
        flat, treespec = tree_flatten(out)
        if plan_aliases:
            out_specs, slot_tensors = _plan_outputs(tr, flat)
        else:
            slot_tensors = [o for o in flat if isinstance(o, torch.Tensor)]
            out_specs = [OutputSpec("graph", slot=i) for i in range(len(slot_tensors))]
        slot_nodes = [tr.node_of(t) for t in slot_tensors]
        mutated = sorted(tr.mutated_inputs())
        mut_nodes = [tr.input_new_value(i) for i in mutated]
        slot_rg = [bool(t.requires_grad) and (t.dtype.is_floating_point or t.dtype.is_complex)
                   for t in slot_tensors]
        tangent_outs, tangent_specs, tangents, grad_nodes, grad_inputs = [], [], [], [], []
        if joint:
            diff = [j for j, rg in enumerate(slot_rg) if rg]
            want = [k for k, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
            for j in diff:
                t = slot_tensors[j]
                spec = TensorSpec(tuple(t.shape), tuple(t.stride()), t.dtype, tr.device, False)
                tangent_specs.append(spec)
                tangents.append(tr.add_input(f"tangent{len(tangents)}", spec))
                tangent_outs.append(j)
            if diff and want:
                grads = torch.autograd.grad([slot_tensors[j] for j in diff], [inputs[k] for k in want],
                                            tangents, allow_unused=True)
                for k, g in zip(want, grads):
                    if g is not None:
                        grad_inputs.append(k)
                        grad_nodes.append(tr.node_of(_in_layout_of(g, inputs[k])))
    tr.graph.output(tuple(slot_nodes + mut_nodes + grad_nodes))
    n_in = len(inputs)
    order = tr.placeholders[:n_in] + [n for n, _ in tr.constants] + tr.placeholders[n_in:]
    order_placeholders(tr.graph, order)
    remove_identity_views(tr.graph)
    tr.graph.eliminate_dead_code()
    tr.graph.lint()
    return Traced(graph=tr.graph, device=tr.device, n_inputs=n_in,
                  constants=[c for _, c in tr.constants], outputs=out_specs,
                  n_slots=len(slot_nodes), slot_requires_grad=slot_rg, mutated=mutated, joint=joint,
                  tangent_outs=tangent_outs, tangent_specs=tangent_specs, grad_inputs=grad_inputs,
                  treespec=treespec, symbols=_symbol_sources(specs))


#: the memory formats an input gradient is stored in when its input has one (4-D, 5-D)
_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def _in_layout_of(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`g`, the traced gradient of input `x`, stored in x's memory format (contiguous, or
    channels-last) when it comes out of the backward in another layout.

    Autograd's gradient layout contract: AccumulateGrad keeps a gradient as its leaf's .grad
    only when its strides are the leaf's (else it copies it: `clone_obey_contract`), and an
    ember graph upstream coerces its tangent to its output's layout, which is x's. So the
    kernel that writes the gradient stores it in that layout (a clone the lowering fuses into
    it) instead of an ATen copy after the graph: LayerNorm over NCHW channels via permutes
    computes dx in NHWC. Layouts with no memory format (a transposed 2-D parameter, symbolic
    strides) are left as traced."""
    if shapes.is_symbolic(x) or shapes.is_symbolic(g) or _same_layout(g, x):
        return g
    for fmt in (torch.contiguous_format, _FORMATS.get(x.dim())):
        if fmt is not None and x.is_contiguous(memory_format=fmt):
            counters.bump("grad_layout_stores")
            return g.contiguous(memory_format=fmt)
    return g


def _same_layout(g: torch.Tensor, x: torch.Tensor) -> bool:
    """Strides equal except along size-1 dims (autograd's `obeys_layout_contract`)."""
    return all(s == 1 or a == b for s, a, b in zip(x.shape, g.stride(), x.stride()))


def _symbol_sources(specs) -> dict:
    """Dynamic shapes: where each size symbol's value is found among the inputs."""
    out: dict = {}
    for i, spec in enumerate(specs):
        if isinstance(spec, torch.SymInt) and isinstance(shapes.expr_of(spec), sympy.Symbol):
            out.setdefault(shapes.expr_of(spec), (i, None))
        elif isinstance(spec, TensorSpec):
            for d, n in enumerate(spec.shape):
                if isinstance(n, torch.SymInt) and isinstance(shapes.expr_of(n), sympy.Symbol):
                    out.setdefault(shapes.expr_of(n), (i, d))
    return out
