"""Backends, torch.while_loop: the loop as a torch.library op every backend runs.

Capture (ember/capture/while_loop.py) turns `torch.while_loop(cond_fn, body_fn, carried)` into one
node `torch.ops.ember.while_loop(key, carried, extra)`, where `key` names the traced cond_fn and
body_fn subgraphs in `LOOPS` and `extra` are the outside tensors they read. aot traces the node
through its fake kernel (the outputs have the carried tensors' shapes and dtypes); the kernel
backend calls it as an extern, which runs the subgraphs (torch-level graphs) per iteration.

Consumes: the carried and extra tensors. Produces: the carried tensors after the last iteration.
"""
from __future__ import annotations

import hashlib

import torch
from torch import Tensor

#: key -> (cond graph, body graph, number of extra inputs the cond graph takes first); graphs'
#: placeholders: the carried tensors, then their outside tensors
LOOPS: dict[str, tuple] = {}


def register(cond_gm, body_gm, n_cond_extra: int) -> str:
    text = f"{cond_gm.code}\n{body_gm.code}\n{n_cond_extra}"
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    LOOPS.setdefault(key, (cond_gm, body_gm, n_cond_extra))
    return key


@torch.library.custom_op("ember::while_loop", mutates_args=())
def while_loop(key: str, carried: list[Tensor], extra: list[Tensor]) -> list[Tensor]:
    cond, body, n = LOOPS[key]
    cond_extra, body_extra = extra[:n], extra[n:]
    values = list(carried)
    while bool(cond(*values, *cond_extra)):
        out = body(*values, *body_extra)
        values = [out] if isinstance(out, Tensor) else list(out)
    # an op's outputs must not alias its inputs (no iteration, or a body passing one through)
    taken = {t.untyped_storage().data_ptr() for t in (*carried, *extra)}
    return [v.clone() if v.untyped_storage().data_ptr() in taken else v for v in values]


@while_loop.register_fake
def _(key, carried, extra):
    return [torch.empty_like(c) for c in carried]
