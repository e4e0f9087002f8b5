"""Capture: a user function traced inline, then cut out of the graph as its own GraphModule.

Consumes a function value and stand-in values the caller added to the graph for its arguments;
produces (GraphModule, [TensorV of each outside tensor it read]). The function is traced by this
interpreter like any inlined call (its globals, closure cells and attributes get their usual
sources and guards); its nodes are then moved into a new graph whose placeholders are the
stand-ins followed by the outside tensors it read (parameters, captured tensors), which the
caller passes as extra inputs. Used for flex_attention's score_mod/mask_mod (capture/flex.py)
and torch.while_loop's cond_fn/body_fn (capture/while_loop.py).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .values import TensorV


def trace_subgraph(tr, fn_v, standins: list, what: str, check_out):
    """Trace fn_v(*standins): `check_out(result)` returns the result's output TensorVs (or
    raises Unsupported). Side effects (Python or tensor mutation) are refused."""
    before = set(tr.graph.nodes) - {s.node for s in standins}
    n_effects, n_mutated = len(tr.effects), len(tr.mutated)
    outs = check_out(tr.call(fn_v, standins, {}))
    if len(tr.effects) != n_effects or len(tr.mutated) != n_mutated:
        raise tr.unsupported(f"{what} has side effects")
    body = [n for n in tr.graph.nodes if n not in before and n.op == "call_function"]
    inputs = {s.node for s in standins}
    sub, env, ext = fx.Graph(), {}, []
    for i, s in enumerate(standins):
        env[s.node] = sub.placeholder(f"arg{i}")

    def arg(a):
        if a not in env:
            val = a.meta.get("example_value")
            if not isinstance(val, torch.Tensor):
                raise tr.unsupported(f"{what} reads a non-tensor value {a.name} of the graph")
            ext.append(a)
            env[a] = sub.placeholder(f"buf{len(ext) - 1}")
        return env[a]
    for n in body:
        if n in inputs:
            continue
        if any(isinstance(x, fx.Node) and x.op == "call_function" and x not in before and
               x not in env for x in n.all_input_nodes):
            raise tr.unsupported(f"{what}: unordered graph")
        env[n] = sub.node_copy(n, arg)
    results = [arg(o.node) for o in outs]
    sub.output(results[0] if len(results) == 1 else tuple(results))
    for n in reversed(body):
        if n.users:
            raise tr.unsupported(f"{what}'s value is used outside it")
        tr.graph.erase_node(n)
    gm = fx.GraphModule(torch.nn.Module(), sub, class_name="Subgraph")
    device = torch.device("cpu")
    return gm, [TensorV(a, a.meta["example_value"], device) for a in ext]
