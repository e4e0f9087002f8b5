"""Stage 3, decomp: pooling. max_pool2d_with_indices (+backward) are extern prims. avg and
adaptive-avg pooling decompose where the decomposition is good (sum of kernel-shifted strided
slices; reshape+mean when the adaptive windows are uniform); other cases return NotImplemented
and stay aten calls (the kernel backend's extern fallback)."""
from __future__ import annotations

import torch

from ._util import in_format_of
from .registry import register

aten = torch.ops.aten


def _pair(v):
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    return v * 2 if len(v) == 1 else v


@register(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride not in (None, [], ()) else (kh, kw)
    ph, pw = _pair(padding)
    if ceil_mode or kh * kw > 49:
        return NotImplemented
    H, W = self.shape[-2], self.shape[-1]
    oh = (H + 2 * ph - kh) // sh + 1
    ow = (W + 2 * pw - kw) // sw + 1
    x = aten.constant_pad_nd.default(self, [pw, pw, ph, ph], 0) if ph or pw else self
    acc = None
    for i in range(kh):
        rows = aten.slice.Tensor(x, -2, i, i + sh * (oh - 1) + 1, sh)
        for j in range(kw):
            win = aten.slice.Tensor(rows, -1, j, j + sw * (ow - 1) + 1, sw)
            acc = win if acc is None else aten.add.Tensor(acc, win)
    return aten.div.Tensor(acc, _divisor(self, kh, kw, sh, sw, ph, pw, oh, ow, count_include_pad,
                                         divisor_override))


def _window_counts(n, k, s, p, out, dtype, device):
    """Per output position along one dim, how many of its k window elements are inside the
    input (not padding): min(o*s - p + k, n) - max(o*s - p, 0), from an iota (a constant the
    kernel computes from the index, not a stored tensor)."""
    start = aten.sub.Tensor(aten.mul.Tensor(
        aten.arange.start_step(0, out, 1, dtype=torch.int64, device=device), s), p)
    hi = aten.clamp.default(aten.add.Tensor(start, k), None, n)
    lo = aten.clamp.default(start, 0, None)
    return aten._to_copy.default(aten.sub.Tensor(hi, lo), dtype=dtype)


def _divisor(self, kh, kw, sh, sw, ph, pw, oh, ow, count_include_pad, divisor_override):
    """What each output of avg_pool2d is divided by: the override, the window size, or (padding
    not counted) the [oh, ow] count of the window's elements inside the input."""
    if divisor_override:
        return divisor_override
    if count_include_pad or not (ph or pw):
        return kh * kw
    H, W = self.shape[-2], self.shape[-1]
    ch = _window_counts(H, kh, sh, ph, oh, self.dtype, self.device)
    cw = _window_counts(W, kw, sw, pw, ow, self.dtype, self.device)
    return aten.mul.Tensor(aten.view.default(ch, [oh, 1]), aten.view.default(cw, [1, ow]))


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride not in (None, [], ()) else (kh, kw)
    ph, pw = _pair(padding)
    if ceil_mode:
        return NotImplemented
    H, W = self.shape[-2], self.shape[-1]
    oh, ow = grad_output.shape[-2], grad_output.shape[-1]
    if (sh, sw) == (1, 1) and kh * kw <= 49:
        # stride 1 (poolformer's token mixer, 3x3 "same" pools): each input pixel sums the
        # divided gradient of the k x k outputs whose windows hold it, i.e. k x k shifted
        # slices of that gradient zero-padded by k - 1 - p on each side
        g = aten.div.Tensor(grad_output, _divisor(self, kh, kw, sh, sw, ph, pw, oh, ow,
                                                  count_include_pad, divisor_override))
        qh, qw = kh - 1 - ph, kw - 1 - pw
        g = aten.constant_pad_nd.default(g, [qw, qw, qh, qh], 0) if qh or qw else g
        acc = None
        for i in range(kh):
            rows = aten.slice.Tensor(g, -2, i, i + H)
            for j in range(kw):
                win = aten.slice.Tensor(rows, -1, j, j + W)
                acc = win if acc is None else aten.add.Tensor(acc, win)
        return in_format_of(acc, self)
    # non-overlapping windows without padding: each input pixel gets one output's grad
    if ph or pw or (sh, sw) != (kh, kw):
        return NotImplemented
    lead = list(grad_output.shape[:-2])
    g = aten.div.Tensor(grad_output, divisor_override if divisor_override else kh * kw)
    g = aten.expand.default(aten.view.default(g, lead + [oh, 1, ow, 1]), lead + [oh, kh, ow, kw])
    g = aten.view.default(aten.clone.default(g, memory_format=torch.contiguous_format), lead + [oh * kh, ow * kw])
    return in_format_of(aten.constant_pad_nd.default(g, [0, W - ow * kw, 0, H - oh * kh], 0), self)


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    oh, ow = _pair(output_size)
    H, W = self.shape[-2], self.shape[-1]
    if oh == 0 or ow == 0 or H % oh or W % ow:
        return NotImplemented
    lead = list(self.shape[:-2])
    x = aten.reshape.default(self, lead + [oh, H // oh, ow, W // ow])
    n = x.dim()
    return in_format_of(aten.mean.dim(x, [n - 3, n - 1]), self)


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    oh, ow = grad_output.shape[-2], grad_output.shape[-1]
    H, W = self.shape[-2], self.shape[-1]
    if oh == 0 or ow == 0 or H % oh or W % ow:
        return NotImplemented
    kh, kw = H // oh, W // ow
    lead = list(grad_output.shape[:-2])
    g = aten.div.Tensor(grad_output, kh * kw)
    g = aten.expand.default(aten.view.default(g, lead + [oh, 1, ow, 1]), lead + [oh, kh, ow, kw])
    g = aten.clone.default(g, memory_format=torch.contiguous_format)
    return in_format_of(aten.view.default(g, list(self.shape)), self)
