"""Capture, control flow: `torch.cond(pred, true_fn, false_fn, operands)` in the graph.

Consumes the call's values; produces the branch outputs. A constant predicate (a Python bool, or
one computed from shapes) inlines the branch it takes. A tensor predicate traces both branches
inline and selects each output with `torch.where(pred, true_out, false_out)`: equal to eager's
values when neither branch has side effects (torch.cond forbids them too) and the outputs agree
in shape and dtype. Where a gradient flows (grad mode on and an output requires grad) this is
refused as a graph break, so torch.cond runs eagerly: the untaken branch's backward would get a
zero gradient, and 0 * inf from its derivative (sqrt at 0, log of a negative) would be a NaN
where eager's gradient is finite.
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
    n_nodes, n_effects, n_mutated = len(tr.graph.nodes), len(tr.effects), len(tr.mutated)
    outs = [_flat(tr, tr.call(bound[fn], operands, {})) for fn in ("true_fn", "false_fn")]
    if len(tr.effects) != n_effects or len(tr.mutated) != n_mutated or any(
            _mutates(n) for n in list(tr.graph.nodes)[n_nodes:]):
        raise tr.unsupported("a torch.cond branch has side effects or mutates a tensor")
    (kind, t_out), (_, f_out) = outs
    if len(t_out) != len(f_out) or any(
            a.meta.shape != b.meta.shape or a.meta.dtype != b.meta.dtype
            for a, b in zip(t_out, f_out)):
        raise tr.unsupported("torch.cond branches return tensors of different shapes or dtypes")
    if torch.is_grad_enabled() and any(a.meta.requires_grad or b.meta.requires_grad
                                       for a, b in zip(t_out, f_out)):
        raise tr.unsupported("torch.cond with a tensor predicate where a gradient flows",
                             hint="traced only without grad; it runs eagerly (a graph break)")
    p = tr.call_graph(torch.reshape, [pred, ObjV(())], {})
    sel = [tr.call_graph(torch.where, [p, a, b], {}) for a, b in zip(t_out, f_out)]
    return sel[0] if kind is None else kind(sel)


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
