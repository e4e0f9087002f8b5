"""Stage capture: `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=...)` in the graph.

Consumes the call; produces fn's ops inlined as usual (so a module's parameters become graph inputs
through their sources), bracketed by `regions.checkpoint_enter/exit` nodes that tell aot to
recompute the span in the backward (ember/regions.py). Both the reentrant and non-reentrant forms
compute the same values and grads, so both are accepted. Selective checkpointing
(`context_fn=functools.partial(create_selective_checkpoint_contexts, policy)`, a function or a
list of ops) passes the policy to the enter marker: aot saves the ops it says to save (regions.py);
any other `context_fn` is refused as a graph break, it runs eagerly.
"""
from __future__ import annotations

import functools

import torch

from .. import regions
from .values import ListV, ObjV, PartialV, TupleV, peek

_IGNORED = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug")


def is_checkpoint(f) -> bool:
    return f is torch.utils.checkpoint.checkpoint


def call_checkpoint(tr, args: list, kwargs: dict):
    if not args:
        raise tr.unsupported("torch.utils.checkpoint.checkpoint without a function")
    kwargs = dict(kwargs)
    ctx_fn = kwargs.pop("context_fn", None)
    policy = None
    if ctx_fn is not None and not (isinstance(ctx_fn, ObjV) and
                                   ctx_fn.value is torch.utils.checkpoint.noop_context_fn):
        policy = _selective_policy(tr, ctx_fn)
        if policy is None:
            raise tr.unsupported("checkpoint with a context_fn other than functools.partial("
                                 "create_selective_checkpoint_contexts, policy)",
                                 hint="not traced; the checkpointed call runs eagerly")
    for k in _IGNORED:
        kwargs.pop(k, None)
    _marker(tr, regions.checkpoint_enter, () if policy is None else (regions.policy_key(policy),))
    out = tr.call(args[0], list(args[1:]), kwargs)
    _marker(tr, regions.checkpoint_exit)
    return out


def _selective_policy(tr, ctx_fn):
    """The policy (a function or a list of ops) of `functools.partial(
    create_selective_checkpoint_contexts, policy)`, made in the trace or read from a real
    partial (guarded by identity); None for any other context_fn."""
    make = torch.utils.checkpoint.create_selective_checkpoint_contexts
    if isinstance(ctx_fn, PartialV):
        func, pargs, pkw = ctx_fn.func, list(ctx_fn.args), dict(ctx_fn.kwargs)
        if not (isinstance(func, ObjV) and func.value is make) or len(pargs) != 1 or pkw:
            return None
        p = pargs[0]
        if isinstance(p, ObjV) and callable(p.value):
            return p.value
        if isinstance(p, (ListV, TupleV)) and all(isinstance(i, ObjV) for i in p.items):
            return [i.value for i in p.items]
        return None
    real = peek(ctx_fn) if isinstance(ctx_fn, ObjV) else None
    if isinstance(real, functools.partial) and real.func is make and len(real.args) == 1 and \
            not real.keywords and ctx_fn.source is not None:
        tr.guard("ID", ctx_fn.source, real)
        return real.args[0]
    return None


def _marker(tr, fn, args=()):
    node = tr.graph.call_function(fn, args, {})
    node.meta["example_value"] = None
