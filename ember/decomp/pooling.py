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
    if ceil_mode or (not count_include_pad and (ph or pw)) or kh * kw > 49:
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
    div = divisor_override if divisor_override else kh * kw
    return aten.div.Tensor(acc, div)


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if stride not in (None, [], ()) else (kh, kw)
    ph, pw = _pair(padding)
    # non-overlapping windows without padding: each input pixel gets one output's grad
    if ceil_mode or ph or pw or (sh, sw) != (kh, kw):
        return NotImplemented
    H, W = self.shape[-2], self.shape[-1]
    oh, ow = grad_output.shape[-2], grad_output.shape[-1]
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
