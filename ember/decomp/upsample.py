"""Stage 3, decomp: upsample_nearest2d / upsample_bilinear2d (+ nearest backward) → index,
index_put and pointwise math; index formulas follow ATen's UpSample.h."""
from __future__ import annotations

import torch

from ._util import in_format_of, opmath_dtype, to
from .registry import register

aten = torch.ops.aten


def _nearest_scale(isize, osize, scale):
    return 1.0 / scale if scale is not None and scale > 0 else isize / osize


def _nearest_index(isize, osize, scale, device):
    i = aten.arange.start_step(0, osize, 1, dtype=torch.float32, device=device)
    src = to(aten.mul.Tensor(i, _nearest_scale(isize, osize, scale)), torch.int64)
    return aten.minimum.default(src, aten.full.default([], isize - 1, dtype=torch.int64, device=device))


def _out_size(input, output_size, scale_factors):
    if output_size is not None:
        return list(output_size)
    return [int(input.shape[-2 + k] * scale_factors[k]) for k in range(2)]


@register(aten.upsample_nearest2d.default)
def upsample_nearest2d(input, output_size, scales_h=None, scales_w=None):
    H, W = input.shape[-2], input.shape[-1]
    oh, ow = output_size
    hi = aten.unsqueeze.default(_nearest_index(H, oh, scales_h, input.device), -1)
    wi = _nearest_index(W, ow, scales_w, input.device)
    return in_format_of(aten._unsafe_index.Tensor(input, [None] * (input.dim() - 2) + [hi, wi]), input)


@register(aten.upsample_nearest2d.vec)
def upsample_nearest2d_vec(input, output_size, scale_factors):
    osize = _out_size(input, output_size, scale_factors)
    sh, sw = (scale_factors if scale_factors else (None, None))
    return upsample_nearest2d(input, osize, sh, sw)


@register(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    H, W = input_size[-2], input_size[-1]
    oh, ow = output_size
    hi = aten.unsqueeze.default(_nearest_index(H, oh, scales_h, grad_output.device), -1)
    wi = _nearest_index(W, ow, scales_w, grad_output.device)
    acc = opmath_dtype(grad_output.dtype)
    zeros = in_format_of(aten.full.default(list(input_size), 0, dtype=acc, device=grad_output.device),
                         grad_output)      # index_put's result keeps this layout
    out = aten.index_put.default(zeros, [None] * (len(input_size) - 2) + [hi, wi],
                                 to(grad_output, acc), True)
    return to(out, grad_output.dtype)


def _linear_coords(isize, osize, align_corners, scale, dtype, device):
    if align_corners:
        s = (isize - 1.0) / (osize - 1.0) if osize > 1 else 0.0
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else isize / osize
    i = aten.arange.start_step(0, osize, 1, dtype=dtype, device=device)
    if align_corners:
        src = aten.mul.Tensor(i, s)
    else:
        src = aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(i, 0.5), s), 0.5)
        src = aten.maximum.default(src, aten.full.default([], 0.0, dtype=dtype, device=device))
    lo = to(src, torch.int64)
    hi = aten.minimum.default(aten.add.Tensor(lo, 1),
                              aten.full.default([], isize - 1, dtype=torch.int64, device=device))
    lam = aten.sub.Tensor(src, to(lo, dtype))
    lam = aten.minimum.default(aten.maximum.default(lam, aten.full.default([], 0.0, dtype=dtype, device=device)),
                               aten.full.default([], 1.0, dtype=dtype, device=device))
    return lo, hi, lam


@register(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(input, output_size, align_corners, scales_h=None, scales_w=None):
    if not input.is_floating_point():
        return NotImplemented
    dtype = opmath_dtype(input.dtype)
    H, W = input.shape[-2], input.shape[-1]
    oh, ow = output_size
    h0, h1, lh = _linear_coords(H, oh, align_corners, scales_h, dtype, input.device)
    w0, w1, lw = _linear_coords(W, ow, align_corners, scales_w, dtype, input.device)
    h0, h1, lh = (aten.unsqueeze.default(t, -1) for t in (h0, h1, lh))
    lead = [None] * (input.dim() - 2)
    x = to(input, dtype)

    def at(h, w):
        return aten._unsafe_index.Tensor(x, lead + [h, w])

    top = aten.add.Tensor(at(h0, w0), aten.mul.Tensor(aten.sub.Tensor(at(h0, w1), at(h0, w0)), lw))
    bot = aten.add.Tensor(at(h1, w0), aten.mul.Tensor(aten.sub.Tensor(at(h1, w1), at(h1, w0)), lw))
    out = aten.add.Tensor(top, aten.mul.Tensor(aten.sub.Tensor(bot, top), lh))
    return in_format_of(to(out, input.dtype), input)


@register(aten.upsample_bilinear2d.vec)
def upsample_bilinear2d_vec(input, output_size, align_corners, scale_factors):
    osize = _out_size(input, output_size, scale_factors)
    sh, sw = (scale_factors if scale_factors else (None, None))
    return upsample_bilinear2d(input, osize, align_corners, sh, sw)
