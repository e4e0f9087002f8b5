"""Capture, control flow: `torch.cond(pred, true_fn, false_fn, operands)` in the graph.

Consumes the call's values; produces the branch outputs. A constant predicate (a Python bool, or
one computed from shapes) inlines the branch it takes. A tensor predicate traces both branches
inline and selects each output with `torch.where(pred, true_out, false_out)`: equal to eager's
values when neither branch has side effects (torch.cond forbids them too) and the outputs agree
in shape and dtype.

Gradients: every tensor that requires grad and enters a branch from outside it (an operand, a
parameter or any earlier value the branch reads) is read inside the branch through a gate,
`where(pred, x, x.detach())` for the true branch (`~pred` for the false one): its value is `x`,
and its backward keeps the branch's gradient only where the branch was taken. So the untaken
branch contributes an exact zero, as in eager (torch.cond's untaken parameters get zero grads),
even where its derivative is infinite (sqrt at 0: 0 * inf would be NaN behind a plain where).
"""
from __future__ import annotations

import torch

from .effects import mutates_first_arg
from .values import ListV, ObjV, TensorV, TupleV


def is_cond(f) -> bool:
    return f is getattr(torch, "cond", None)


def call_cond(tr, args: list, kwargs: dict):
    names = ("pred", "true_fn", "false_fn", "operands")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if set(bound) - set(names) or len(bound) < 3:
        raise tr.unsupported("torch.cond with unexpected arguments")
    pred, operands = bound["pred"], bound.get("operands", TupleV([]))
    operands = list(operands.items) if isinstance(operands, (TupleV, ListV)) else [operands]
    if isinstance(pred, ObjV):
        if not isinstance(pred.value, (bool, int)):
            raise tr.unsupported(f"torch.cond with a {type(pred.value).__name__} predicate")
        return tr.call(bound["true_fn" if pred.value else "false_fn"], operands, {})
    if not isinstance(pred, TensorV) or pred.meta.numel() != 1 or pred.meta.dtype != torch.bool:
        raise tr.unsupported("torch.cond whose predicate is not a one-element bool tensor")
    n_effects, n_mutated = len(tr.effects), len(tr.mutated)
    p = tr.call_graph(torch.reshape, [pred, ObjV(())], {})
    not_p = tr.call_graph(torch.logical_not, [p], {})
    outs = []
    for fn, taken in (("true_fn", p), ("false_fn", not_p)):
        mark = list(tr.graph.nodes)[-1]
        outs.append(_flat(tr, tr.call(bound[fn], operands, {})))
        branch = _nodes_after(tr.graph, mark)
        if any(_mutates(n) for n in branch):
            raise tr.unsupported("a torch.cond branch has side effects or mutates a tensor")
        if torch.is_grad_enabled():
            _gate_inputs(tr.graph, branch, taken.node)
    if len(tr.effects) != n_effects or len(tr.mutated) != n_mutated:
        raise tr.unsupported("a torch.cond branch has side effects or mutates a tensor")
    (kind, t_out), (_, f_out) = outs
    if len(t_out) != len(f_out) or any(
            a.meta.shape != b.meta.shape or a.meta.dtype != b.meta.dtype
            for a, b in zip(t_out, f_out)):
        raise tr.unsupported("torch.cond branches return tensors of different shapes or dtypes")
    sel = [tr.call_graph(torch.where, [p, a, b], {}) for a, b in zip(t_out, f_out)]
    return sel[0] if kind is None else kind(sel)


def _nodes_after(graph, mark) -> list:
    """The nodes appended after `mark`, placeholders aside (capture adds an input where the
    trace first reads it, so a parameter first read in a branch is added there)."""
    nodes = list(graph.nodes)
    return [n for n in nodes[nodes.index(mark) + 1:] if n.op != "placeholder"]


def _gate_inputs(graph, branch: list, taken) -> None:
    """Read each outside tensor that requires grad through `where(taken, x, x.detach())`."""
    inside = set(branch)
    gates = {}
    for node in branch:
        for x in list(node.all_input_nodes):
            val = x.meta.get("example_value")
            if x in inside or x is taken or not isinstance(val, torch.Tensor) or \
                    not val.requires_grad:
                continue
            gate = gates.get(x)
            if gate is None:
                with graph.inserting_before(node):
                    det = graph.call_function(torch.Tensor.detach, (x,))
                    det.meta["example_value"] = val.detach()
                    gate = graph.call_function(torch.where, (taken, x, det))
                    gate.meta["example_value"] = torch.where(
                        taken.meta["example_value"], val, val.detach())
                gates[x] = gate
            node.replace_input_with(x, gate)


def _flat(tr, out):
    """(rebuild, [TensorV...]): rebuild None for a single tensor output."""
    if isinstance(out, TensorV):
        return None, [out]
    if isinstance(out, (TupleV, ListV)) and all(isinstance(o, TensorV) for o in out.items):
        cls = type(out)
        return (lambda items: cls(items)), list(out.items)
    raise tr.unsupported("a torch.cond branch returns something other than tensors")


def _mutates(node) -> bool:
    name = getattr(node.target, "__name__", "")
    if isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return mutates_first_arg(node)
    return node.op == "call_function" and name.endswith("_") and not name.endswith("__")
