"""Stage 3, decomp: pooling. max_pool2d_with_indices (+backward) are extern prims. avg and
adaptive-avg pooling decompose where the decomposition is good (sum of kernel-shifted strided
slices; reshape+mean when the adaptive windows are uniform, separable masked sums of gathers
when they are not, e.g. 30 -> 7); adaptive max pooling over uniform windows (max, and the
index by vectorized min/max reductions with ATen's NaN rule); other cases return NotImplemented
and stay aten calls (the kernel backend's extern fallback)."""
from __future__ import annotations

import torch

from ._util import channels_last, in_format_of, to, upcast, where
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


def _adaptive_windows(n, out, device):
    """ATen's adaptive windows along one dim: output i pools [floor(i*n/out), ceil((i+1)*n/out)).
    Per output, as int64 iotas: the window's first and last index and its size; and the
    smallest and largest size (uneven windows differ by one)."""
    sizes = [-(-((i + 1) * n) // out) - (i * n) // out for i in range(out)]
    i = aten.arange.start_step(0, out, 1, dtype=torch.int64, device=device)
    first = aten.div.Tensor_mode(aten.mul.Tensor(i, n), out, rounding_mode="floor")
    last = aten.div.Tensor_mode(aten.add.Tensor(aten.mul.Tensor(i, n), n - 1), out,
                                rounding_mode="floor")
    return first, last, aten.add.Tensor(aten.sub.Tensor(last, first), 1), min(sizes), max(sizes)


def _window_taps(n, out, device):
    """(index, mask) per window offset along one dim: offsets below the smallest size read
    first + a (always inside the window); the one offset past it, where windows are uneven,
    reads the last element, masked where the window is the short one. Indices stay affine
    floors of the iota (no clamp), which the gather computes in place instead of a table."""
    first, last, size, kmin, kmax = _adaptive_windows(n, out, device)
    taps = [(aten.add.Tensor(first, a), None) for a in range(kmin)]
    if kmax > kmin:
        taps.append((last, aten.gt.Scalar(size, kmin)))
    return taps, kmax - kmin


def _taps_sum(x, dim, n_out):
    """Sum over the adaptive windows of x along `dim` (-2 or -1) into n_out: one gather per
    window offset, masked where a window is one shorter; None if they are too many to unroll."""
    taps, spread = _window_taps(x.shape[dim], n_out, x.device)
    if len(taps) > 16 or spread > 1:
        return None
    lead = [None] * (x.dim() + dim)
    acc = None
    for idx, mask in taps:
        if dim == -2 and mask is not None:
            mask = aten.unsqueeze.default(mask, -1)
        v = aten._unsafe_index.Tensor(x, lead + [idx])
        v = v if mask is None else where(mask, v, 0)
        acc = v if acc is None else aten.add.Tensor(acc, v)
    return acc


def _static(*sizes):
    """Whether the sizes are plain ints: the unroll depends on them, and asking a symbolic
    tensor's layout (channels-last) would add guards, a recompile per size."""
    return all(isinstance(v, int) for v in sizes)


def _window_sum(x, oh, ow):
    """Sum of x's last two dims over the adaptive windows of an [oh, ow] output, one dim at a
    time (each pass a kernel: the first is stored since the second reads it per tap). The pass
    along W gathers within rows, so it runs on the smaller side: second when pooling shrinks W,
    first when it grows it (a backward). None where the sizes are symbolic or the windows too
    large to unroll."""
    if not _static(*x.shape[-2:], oh, ow):
        return None
    order = [(-2, oh), (-1, ow)] if ow <= x.shape[-1] else [(-1, ow), (-2, oh)]
    for dim, n in order:
        x = _taps_sum(x, dim, n) if x is not None else None
    return x


def _window_count(n_h, oh, n_w, ow, like):
    """[oh, ow] element counts of the adaptive windows pooling [n_h, n_w] into [oh, ow]."""
    nh = _adaptive_windows(n_h, oh, like.device)[2]
    nw = _adaptive_windows(n_w, ow, like.device)[2]
    return to(aten.mul.Tensor(aten.unsqueeze.default(nh, -1), nw), like.dtype)


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    oh, ow = _pair(output_size)
    H, W = self.shape[-2], self.shape[-1]
    if oh == 0 or ow == 0:
        return NotImplemented
    if H % oh or W % ow:
        # uneven windows (30 -> 7, sizes 5 and 6): masked window sums over the counts;
        # channels-last stays eager's kernel (vectorized over C; the gathers ran 0.2x of it)
        if not _static(H, W, oh, ow) or channels_last(self):
            return NotImplemented
        acc = _window_sum(upcast(self), oh, ow)
        if acc is None:
            return NotImplemented
        out = aten.div.Tensor(acc, _window_count(H, oh, W, ow, acc))
        return in_format_of(to(out, self.dtype), self)
    lead = list(self.shape[:-2])
    x = aten.reshape.default(self, lead + [oh, H // oh, ow, W // ow])
    n = x.dim()
    return in_format_of(aten.mean.dim(x, [n - 3, n - 1]), self)


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    oh, ow = grad_output.shape[-2], grad_output.shape[-1]
    H, W = self.shape[-2], self.shape[-1]
    if oh == 0 or ow == 0:
        return NotImplemented
    if H % oh or W % ow:
        # input h lies in the outputs [floor(h*oh/H), ceil((h+1)*oh/H)): the same window rule
        # with the sizes swapped, so the gradient is a windowed sum of grad / count
        if not _static(H, W, oh, ow) or channels_last(self) or channels_last(grad_output):
            return NotImplemented
        g = upcast(grad_output)
        acc = _window_sum(aten.div.Tensor(g, _window_count(H, oh, W, ow, g)), H, W)
        if acc is None:
            return NotImplemented
        return in_format_of(to(acc, grad_output.dtype), self)
    kh, kw = H // oh, W // ow
    lead = list(grad_output.shape[:-2])
    g = aten.div.Tensor(grad_output, kh * kw)
    g = aten.expand.default(aten.view.default(g, lead + [oh, 1, ow, 1]), lead + [oh, kh, ow, kw])
    g = aten.clone.default(g, memory_format=torch.contiguous_format)
    return in_format_of(aten.view.default(g, list(self.shape)), self)


def _max_windows(self, output_size):
    """(L, oh, ow, kh, kw) when adaptive max pooling of `self` [..., H, W] is over whole,
    uniform windows of a contiguous float input (3-D or 4-D, static sizes), else None."""
    oh, ow = _pair(output_size)
    H, W = self.shape[-2], self.shape[-1]
    if self.dim() not in (3, 4) or not _static(*self.shape, oh, ow) or not self.dtype.is_floating_point:
        return None
    if oh == 0 or ow == 0 or H % oh or W % ow or channels_last(self) or self.numel() == 0:
        return None
    return _lead_numel(self), oh, ow, H // oh, W // ow


def _lead_numel(t) -> int:
    n = 1
    for s in t.shape[:-2]:
        n *= s
    return n


@register(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    """Uniform windows: a max and an argmax per window, in one row kernel. Index rule: ATen's
    CPU kernel takes a window's first maximum, but the LAST NaN (`val > max || isnan(val)`),
    where argmax takes the first NaN: a window with a NaN takes the position of its last NaN
    (a max over `isnan ? position : -1`). The index is the position in the H x W plane."""
    win = _max_windows(self, output_size)
    if win is None:
        return NotImplemented
    L, oh, ow, kh, kw = win
    H, W = self.shape[-2], self.shape[-1]
    x = aten.reshape.default(self, [L, oh, kh, ow, kw])
    x = aten.reshape.default(aten.permute.default(x, [0, 1, 3, 2, 4]), [L, oh, ow, kh * kw])
    value = aten.amax.default(x, [-1], True)
    k = aten.arange.start_step(0, kh * kw, 1, dtype=torch.int64, device=self.device)
    # argmax as a min over positions where x is the max: a plain vectorized min reduction
    # (argmax's compare-and-branch per element ran scalar, 5x the max's time)
    first = aten.amin.default(where(aten.eq.Tensor(x, value), k, kh * kw), [-1])
    last_nan = aten.amax.default(where(aten.isnan.default(x), k, -1), [-1])
    k = aten.where.self(aten.ge.Scalar(last_nan, 0), last_nan, first)
    value = aten.squeeze.dim(value, -1)
    i = aten.arange.start_step(0, oh, 1, dtype=torch.int64, device=self.device)
    j = aten.arange.start_step(0, ow, 1, dtype=torch.int64, device=self.device)
    h = aten.add.Tensor(aten.unsqueeze.default(aten.mul.Tensor(i, kh), -1),
                        aten.div.Tensor_mode(k, kw, rounding_mode="floor"))
    w = aten.add.Tensor(aten.mul.Tensor(j, kw), aten.remainder.Scalar(k, kw))
    index = aten.add.Tensor(aten.mul.Tensor(h, W), w)
    shape = list(self.shape[:-2]) + [oh, ow]
    return aten.reshape.default(value, shape), aten.reshape.default(index, shape)


@register(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    """Uniform windows do not overlap: each input position takes its window's gradient where
    it is the window's index, else 0 (one pointwise kernel, no zero fill and scatter)."""
    win = _max_windows(self, grad_output.shape[-2:])
    if win is None or channels_last(grad_output):
        return NotImplemented
    L, oh, ow, kh, kw = win
    H, W = self.shape[-2], self.shape[-1]

    def spread(t):      # [..., oh, ow] -> [..., H, W], each window's value over its window
        t = aten.expand.default(aten.reshape.default(t, [L, oh, 1, ow, 1]), [L, oh, kh, ow, kw])
        return aten.reshape.default(aten.clone.default(t, memory_format=torch.contiguous_format),
                                    list(self.shape))
    # the plane position as one iota viewed [H, W]: the kernel's loops over H and W merge
    pos = aten.reshape.default(
        aten.arange.start_step(0, H * W, 1, dtype=torch.int64, device=self.device), [H, W])
    return where(aten.eq.Tensor(spread(indices), pos), spread(grad_output), 0)
