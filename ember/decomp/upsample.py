"""Stage 3, decomp: upsample_nearest2d / upsample_bilinear2d / upsample_bicubic2d (+ nearest and
bilinear backward) → index, index_put and pointwise math; index formulas follow ATen's UpSample.h."""
from __future__ import annotations

import math

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


def _src_scale(isize, osize, align_corners, scale):
    if align_corners:
        return (isize - 1.0) / (osize - 1.0) if osize > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else isize / osize


def _coords_at(i, isize, s, align_corners):
    """ATen's linear source index at output positions `i` (float): (lo, hi, weight of hi)."""
    dtype, device = i.dtype, i.device
    if align_corners:
        src = aten.mul.Tensor(i, s)
    else:
        src = aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(i, 0.5), s), 0.5)
        src = aten.maximum.default(src, aten.full.default([], 0.0, dtype=dtype, device=device))
    # src >= 0, so floor is ATen's truncation; the weight then needs no float -> int -> float
    # per element (which does not vectorize where the weight is inlined)
    lo_f = aten.floor.default(src)
    lo = to(lo_f, torch.int64)
    hi = aten.minimum.default(aten.add.Tensor(lo, 1),
                              aten.full.default([], isize - 1, dtype=torch.int64, device=device))
    lam = aten.sub.Tensor(src, lo_f)
    lam = aten.minimum.default(aten.maximum.default(lam, aten.full.default([], 0.0, dtype=dtype, device=device)),
                               aten.full.default([], 1.0, dtype=dtype, device=device))
    return lo, hi, lam


def _linear_coords(isize, osize, align_corners, scale, dtype, device):
    i = aten.arange.start_step(0, osize, 1, dtype=dtype, device=device)
    return _coords_at(i, isize, _src_scale(isize, osize, align_corners, scale), align_corners)


@register(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(input, output_size, align_corners, scales_h=None, scales_w=None):
    """Separable, as ATen's kernel weighs it: rows interpolated along H (contiguous loads at two
    source rows), then along W from that row. With the kernel backend's row gather
    (schedule/fuse.py) the second pass reads the first's row in the cache: one pass over the
    input, and the per-column indices and weights are small tables (lower: _index_table)."""
    if not input.is_floating_point():
        return NotImplemented
    dtype = opmath_dtype(input.dtype)
    H, W = input.shape[-2], input.shape[-1]
    oh, ow = output_size
    h0, h1, lh = _linear_coords(H, oh, align_corners, scales_h, dtype, input.device)
    w0, w1, lw = _linear_coords(W, ow, align_corners, scales_w, dtype, input.device)
    lead = [None] * (input.dim() - 2)
    x = to(input, dtype)
    top, bot = (aten._unsafe_index.Tensor(x, lead + [h]) for h in (h0, h1))
    rows = aten.add.Tensor(top, aten.mul.Tensor(aten.sub.Tensor(bot, top), aten.unsqueeze.default(lh, -1)))
    left, right = (aten._unsafe_index.Tensor(rows, lead + [None, w]) for w in (w0, w1))
    out = aten.add.Tensor(left, aten.mul.Tensor(aten.sub.Tensor(right, left), lw))
    return in_format_of(to(out, input.dtype), input)


def _vec(interp2d):
    """The .vec overload (output size or scale factors) of a 2-D interpolation."""
    def vec(input, output_size, align_corners, scale_factors):
        osize = _out_size(input, output_size, scale_factors)
        sh, sw = (scale_factors if scale_factors else (None, None))
        return interp2d(input, osize, align_corners, sh, sw)
    return vec


register(aten.upsample_bilinear2d.vec)(_vec(upsample_bilinear2d))


def _cubic_taps(isize, osize, align_corners, scale, dtype, device):
    """ATen's bicubic source taps at every output position (HelperInterpCubic, guard_index_and_lambda):
    four clamped int64 indices and their weights (get_cubic_upsample_coefficients, A = -0.75)."""
    i = aten.arange.start_step(0, osize, 1, dtype=dtype, device=device)
    s = _src_scale(isize, osize, align_corners, scale)
    # cubic: the source index is not clamped at 0 (ATen's area_pixel_compute_source_index)
    src = aten.mul.Tensor(i, s) if align_corners else \
        aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(i, 0.5), s), 0.5)
    lo_f = aten.minimum.default(aten.floor.default(src), aten.full.default([], isize - 1.0, dtype=dtype,
                                                                             device=device))
    t = aten.clamp.default(aten.sub.Tensor(src, lo_f), 0.0, 1.0)
    lo = to(lo_f, torch.int64)
    a = -0.75

    def near(x):    # |x| <= 1
        return aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(
            aten.sub.Tensor(aten.mul.Tensor(x, a + 2), a + 3), x), x), 1.0)

    def far(x):     # 1 < |x| < 2
        return aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(aten.mul.Tensor(
            aten.sub.Tensor(aten.mul.Tensor(x, a), 5 * a), x), 8 * a), x), 4 * a)
    t1 = aten.rsub.Scalar(t, 1.0)
    weights = [far(aten.add.Tensor(t, 1.0)), near(t), near(t1), far(aten.add.Tensor(t1, 1.0))]
    idx = [aten.clamp.default(aten.add.Tensor(lo, k - 1), 0, isize - 1) for k in range(4)]
    return idx, weights


@register(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(input, output_size, align_corners, scales_h=None, scales_w=None):
    """Separable like bilinear (rows along H from four source rows, then four gathers along W
    from that row, in the cache); ATen sums the 16 taps per output instead, W inside H: the same
    products in another order (fp32 rounding differs by ulps)."""
    if not input.is_floating_point():
        return NotImplemented    # uint8 bicubic rounds and clamps its weights
    dtype = opmath_dtype(input.dtype)
    H, W = input.shape[-2], input.shape[-1]
    oh, ow = output_size
    hs, hw = _cubic_taps(H, oh, align_corners, scales_h, dtype, input.device)
    ws, ww = _cubic_taps(W, ow, align_corners, scales_w, dtype, input.device)
    lead = [None] * (input.dim() - 2)
    x = to(input, dtype)
    rows = None
    for h, w in zip(hs, hw):
        term = aten.mul.Tensor(aten._unsafe_index.Tensor(x, lead + [h]), aten.unsqueeze.default(w, -1))
        rows = term if rows is None else aten.add.Tensor(rows, term)
    out = None
    for c, w in zip(ws, ww):
        term = aten.mul.Tensor(aten._unsafe_index.Tensor(rows, lead + [None, c]), w)
        out = term if out is None else aten.add.Tensor(out, term)
    return in_format_of(to(out, input.dtype), input)


register(aten.upsample_bicubic2d.vec)(_vec(upsample_bicubic2d))


# output positions a source position may receive gradient from, at most (more: the aten kernel)
_MAX_TAPS = 16


def _linear_backward_pass(g, dim, isize, osize, align_corners, scale):
    """The gradient of one linear pass along `dim` (size osize in g) as a gather: source
    position j sums g at the K output positions base(j) + k whose lo or hi is j, weighted as in
    the forward pass (the weights are recomputed by the forward's own formula, so positions the
    window over-covers get weight 0). None when the taps are too many."""
    s = _src_scale(isize, osize, align_corners, scale)
    if not 0 < s <= 1:
        # (downsampling: ATen's scatter of the smaller grad_output costs less per source
        # position than this gather's ceil(2/s) + 3 taps; bilinear_down2 train 1.47 -> 0.94)
        return None
    taps = math.ceil(2 / s) + 3
    if taps > _MAX_TAPS:
        return None
    dtype, device = g.dtype, g.device
    j = aten.arange.start_step(0, isize, 1, dtype=dtype, device=device)
    first = aten.sub.Tensor(j, 1.0 if align_corners else 0.5)
    first = aten.div.Tensor(first, s) if align_corners else aten.sub.Tensor(aten.div.Tensor(first, s), 0.5)
    base = aten.sub.Tensor(to(aten.floor.default(first), torch.int64), 1)
    ji = aten.arange.start_step(0, isize, 1, dtype=torch.int64, device=device)
    zero = aten.full.default([], 0, dtype=torch.int64, device=device)
    last = aten.full.default([], osize - 1, dtype=torch.int64, device=device)
    lead = [None] * (g.dim() - 2)
    out = None
    for k in range(taps):
        o = aten.add.Tensor(base, k)
        valid = aten.logical_and.default(aten.ge.Scalar(o, 0), aten.le.Scalar(o, osize - 1))
        oc = aten.minimum.default(aten.maximum.default(o, zero), last)
        lo, hi, lam = _coords_at(to(oc, dtype), isize, s, align_corners)
        w = aten.add.Tensor(aten.mul.Tensor(to(aten.eq.Tensor(lo, ji), dtype), aten.rsub.Scalar(lam, 1.0)),
                            aten.mul.Tensor(to(aten.eq.Tensor(hi, ji), dtype), lam))
        w = aten.where.self(valid, w, aten.full.default([], 0.0, dtype=dtype, device=device))
        if dim == -2:
            term = aten.mul.Tensor(aten._unsafe_index.Tensor(g, lead + [oc]), aten.unsqueeze.default(w, -1))
        else:
            term = aten.mul.Tensor(aten._unsafe_index.Tensor(g, lead + [None, oc]), w)
        out = term if out is None else aten.add.Tensor(out, term)
    return out


@register(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    """Separable and gathered (ATen scatters each output's four weights, one element at a
    time): along H over whole rows, then along W from the row just computed (row gather)."""
    if not grad_output.is_floating_point():
        return NotImplemented
    H, W = input_size[-2], input_size[-1]
    oh, ow = output_size
    g = to(grad_output, opmath_dtype(grad_output.dtype))
    rows = _linear_backward_pass(g, -2, H, oh, align_corners, scales_h)
    out = None if rows is None else _linear_backward_pass(rows, -1, W, ow, align_corners, scales_w)
    if out is None:
        return NotImplemented
    return in_format_of(to(out, grad_output.dtype), grad_output)
