"""Capture, tensor subclasses: inputs that follow PyTorch's traceable-subclass protocol
(`__torch_dispatch__` + `__tensor_flatten__` / `__tensor_unflatten__`: torchao's quantized
tensors, a "two tensors" wrapper) enter the graph as one placeholder each.

Consumes a real subclass tensor and its source; produces the meta example value the trace runs
on (the same class rebuilt by `__tensor_unflatten__` around meta copies of its inner tensors, so
the subclass's own `__torch_function__` / `__torch_dispatch__` compute shapes) and the guards:
the outer TENSOR guard (its type among it), FLATTEN on the attribute names and the flatten
context, and a TENSOR guard per inner tensor (read with getattr, as the protocol promises).
The graph stays torch-level; aot (aot/subclass.py) flattens it at the graph boundary.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .sources import AttrSource

PLAIN = (torch.Tensor, torch.nn.Parameter)


def is_traceable_subclass(value) -> bool:
    return type(value) not in PLAIN and is_traceable_wrapper_subclass(value)


def flatten_meta(t) -> tuple:
    """(inner attribute names, flatten context): what FLATTEN guards compare."""
    attrs, ctx = t.__tensor_flatten__()
    return tuple(attrs), ctx


def meta_copy(value: torch.Tensor) -> torch.Tensor:
    """`value` on meta: plain tensors as empty_strided, subclasses rebuilt around meta inners."""
    if not is_traceable_subclass(value):
        t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return t.requires_grad_(True) if value.requires_grad else t
    attrs, ctx = value.__tensor_flatten__()
    inner = {a: meta_copy(getattr(value, a)) for a in attrs}
    out = type(value).__tensor_unflatten__(inner, ctx, value.shape, value.stride())
    return out.requires_grad_(True) if value.requires_grad else out


def guard_inner(tr, value: torch.Tensor, source) -> None:
    """FLATTEN on `value` and TENSOR (recursively FLATTEN) on each inner tensor."""
    tr.guard("FLATTEN", source, flatten_meta(value))
    for a in flatten_meta(value)[0]:
        t, src = getattr(value, a), AttrSource(source, a)
        tr.guard("TENSOR", src, (type(t), t.dtype, t.device, tuple(t.shape), t.stride(),
                                 t.requires_grad, t.is_neg()))
        if is_traceable_subclass(t):
            guard_inner(tr, t, src)
