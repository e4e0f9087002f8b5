"""Capture, control flow: `torch.while_loop(cond_fn, body_fn, carried_inputs)` in the graph.

Consumes the call's values; produces the node `torch.ops.ember.while_loop(key, carried, extra)`
(ember/backends/while_loop.py runs the loop) and returns the final carried tensors. Like
Dynamo's while_loop higher-order op, cond_fn and body_fn are traced as subgraphs on stand-ins of
the carried tensors (capture/subgraph.py: inline, with guards on what they read, then cut out);
the outside tensors they read (parameters, captured tensors) become the op's `extra` inputs.
The trip count is data-dependent, so the loop runs at run time: each iteration calls the two
subgraphs, the rest of the graph is compiled around the node.

Refused (a graph break, the call runs eagerly): carried values other than a flat tuple/list of
tensors (ints, nested containers), a body returning other shapes or dtypes than it takes, side
effects in cond_fn or body_fn, a cond_fn not returning a one-element bool tensor, and gradients
(a carried or read tensor that requires grad while grad is enabled).
"""
from __future__ import annotations

import torch

from .subgraph import trace_subgraph
from .values import ListV, ObjV, TensorV, TupleV


def is_while_loop(f) -> bool:
    return f is getattr(torch, "while_loop", None)


def call_while_loop(tr, args: list, kwargs: dict):
    from ..backends import while_loop as runtime
    names = ("cond_fn", "body_fn", "carried_inputs")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if set(bound) != set(names):
        raise tr.unsupported("torch.while_loop with unexpected arguments")
    carried_v = bound["carried_inputs"]
    if not isinstance(carried_v, (TupleV, ListV)) or not carried_v.items or \
            not all(isinstance(c, TensorV) for c in carried_v.items):
        raise tr.unsupported("torch.while_loop carrying values other than a flat tuple of "
                             "tensors")
    carried = list(carried_v.items)
    metas = [(c.meta.shape, c.meta.dtype) for c in carried]

    def standins():
        return [tr.call_graph(torch.empty_like, [c], {}) for c in carried]

    def check_cond(out):
        if not isinstance(out, TensorV) or out.meta.numel() != 1 or \
                out.meta.dtype != torch.bool:
            raise tr.unsupported("torch.while_loop's cond_fn does not return a one-element "
                                 "bool tensor")
        return [out]

    def check_body(out):
        outs = [out] if isinstance(out, TensorV) else \
            list(out.items) if isinstance(out, (TupleV, ListV)) else None
        if outs is None or not all(isinstance(o, TensorV) for o in outs) or \
                [(o.meta.shape, o.meta.dtype) for o in outs] != metas:
            raise tr.unsupported("torch.while_loop's body_fn does not return tensors of the "
                                 "carried shapes and dtypes")
        return outs
    cond_gm, cond_ext = trace_subgraph(tr, bound["cond_fn"], standins(),
                                       "torch.while_loop's cond_fn", check_cond)
    body_gm, body_ext = trace_subgraph(tr, bound["body_fn"], standins(),
                                       "torch.while_loop's body_fn", check_body)
    extra = cond_ext + body_ext
    if torch.is_grad_enabled() and any(v.meta.requires_grad for v in carried + extra):
        raise tr.unsupported("torch.while_loop with tensors that require grad",
                             hint="the loop runs eagerly")
    key = runtime.register(cond_gm, body_gm, len(cond_ext))
    out = tr.call_graph(torch.ops.ember.while_loop.default,
                        [ObjV(key), ListV(carried), ListV(extra)], {})
    items = out.items if isinstance(out, (TupleV, ListV)) else [out]
    return type(carried_v)(list(items))
