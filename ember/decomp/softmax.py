"""Stage 3, decomp: softmax / log_softmax and their backwards → amax, sum, exp, log.

Computed in the opmath dtype; `half_to_float` keeps the fp32 result.
"""
from __future__ import annotations

import torch

from ._util import canonical_dim, opmath_dtype, to, where
from .registry import register

aten = torch.ops.aten


def _amax_safe(x, dim):
    if x.dim() > 0 and x.shape[canonical_dim(dim, x.dim())] == 0:
        return None
    return aten.amax.default(x, [dim], True)


def _prep(x):
    x = aten.clone.default(x, memory_format=torch.contiguous_format) if not x.is_contiguous() else x
    return to(x, opmath_dtype(x.dtype))


@register(aten._softmax.default)
def softmax(x, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else x.dtype
    xa = _prep(x)
    m = _amax_safe(xa, dim)
    e = aten.exp.default(aten.sub.Tensor(xa, m) if m is not None else xa)
    # times 1/sum, as ATen's vectorized CPU softmax computes it (one reciprocal per row, not a
    # division per element)
    inv = aten.reciprocal.default(aten.sum.dim_IntList(e, [dim], True))
    return to(aten.mul.Tensor(e, inv), out_dtype)


@register(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else x.dtype
    xa = _prep(x)
    m = _amax_safe(xa, dim)
    shifted = aten.sub.Tensor(xa, m) if m is not None else xa
    lse = aten.log.default(aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True))
    return to(aten.sub.Tensor(shifted, lse), out_dtype)


@register(aten._safe_softmax.default)
def safe_softmax(x, dim, dtype=None):
    xd = to(x, dtype) if dtype is not None else x
    out = softmax(xd, dim, False)
    masked_row = aten.amin.default(aten.eq.Scalar(x, float("-inf")), [dim], True) \
        if x.numel() else aten.eq.Scalar(x, float("-inf"))
    return where(masked_row, 0, out)


@register(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    acc = opmath_dtype(grad_output.dtype)
    g, y = to(grad_output, acc), to(output, acc)
    # y * (g - sum(g * y)), ATen's form: one multiply per element fewer than g*y - y*sum
    dot = aten.sum.dim_IntList(aten.mul.Tensor(g, y), [dim], True)
    gi = aten.mul.Tensor(y, aten.sub.Tensor(g, dot))
    return to(gi, input_dtype)


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    acc = opmath_dtype(grad_output.dtype)
    g, y = to(grad_output, acc), to(output, acc)
    gi = aten.sub.Tensor(g, aten.mul.Tensor(aten.exp.default(y),
                                            aten.sum.dim_IntList(g, [dim], True)))
    return to(gi, input_dtype)
