"""Stage capture: `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=...)` in the graph.

Consumes the call; produces fn's ops inlined as usual (so a module's parameters become graph inputs
through their sources), bracketed by `regions.checkpoint_enter/exit` nodes that tell aot to
recompute the span in the backward (ember/regions.py). Both the reentrant and non-reentrant forms
compute the same values and grads, so both are accepted; a `context_fn` (selective checkpointing
policies) is refused as a graph break, it runs eagerly.
"""
from __future__ import annotations

import torch

from .. import regions
from .values import ObjV

_IGNORED = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug")


def is_checkpoint(f) -> bool:
    return f is torch.utils.checkpoint.checkpoint


def call_checkpoint(tr, args: list, kwargs: dict):
    if not args:
        raise tr.unsupported("torch.utils.checkpoint.checkpoint without a function")
    kwargs = dict(kwargs)
    ctx_fn = kwargs.pop("context_fn", None)
    if ctx_fn is not None and not (isinstance(ctx_fn, ObjV) and
                                   ctx_fn.value is torch.utils.checkpoint.noop_context_fn):
        raise tr.unsupported("checkpoint with a context_fn (selective checkpointing policy)",
                             hint="not traced yet; the checkpointed call runs eagerly")
    for k in _IGNORED:
        kwargs.pop(k, None)
    _marker(tr, regions.checkpoint_enter)
    out = tr.call(args[0], list(args[1:]), kwargs)
    _marker(tr, regions.checkpoint_exit)
    return out


def _marker(tr, fn):
    node = tr.graph.call_function(fn, (), {})
    node.meta["example_value"] = None
