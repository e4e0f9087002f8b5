"""Stage 3, decomp: shape ops → view prims (permute/squeeze/slice/select/as_strided) and data
movement (cat, constant_pad_nd, index, index_put, where): transpose, split, unbind, stack,
repeat, flip, roll, reflection/replication pads, tril/triu, the *_backward and *_scatter ops of views, *_copy variants."""
from __future__ import annotations

import torch

from ._util import canonical_dim, canonical_dims, in_format_of, where
from .registry import register

aten = torch.ops.aten


def _arange(n, like, dtype=torch.int64):
    return aten.arange.start_step(0, n, 1, dtype=dtype, device=like.device)


@register(aten.t.default)
def t(self):
    if self.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.dim()}D")
    return aten.permute.default(self, list(range(self.dim()))[::-1])


@register(aten.transpose.int)
def transpose(self, dim0, dim1):
    nd = self.dim()
    if nd == 0:
        canonical_dim(dim0, nd), canonical_dim(dim1, nd)
        return aten.alias.default(self)
    d0, d1 = canonical_dim(dim0, nd), canonical_dim(dim1, nd)
    perm = list(range(nd))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return aten.permute.default(self, perm)


@register(aten.squeeze.default)
def squeeze(self):
    return aten.squeeze.dims(self, list(range(self.dim())))


@register(aten.squeeze.dim)
def squeeze_dim(self, dim):
    return aten.squeeze.dims(self, [dim])


# lift_fresh (a torch.tensor(...) constant entering the trace) is the tracer's business.
@register(aten.detach.default)
def detach(self):
    return aten.alias.default(self)


@register(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return aten.clone.default(self)


@register(aten.split.Tensor, aten.unsafe_split.Tensor)
def split(self, split_size, dim=0):
    d = canonical_dim(dim, self.dim())
    n = self.shape[d]
    if split_size == 0 and n == 0:
        return [aten.alias.default(self)]
    if split_size <= 0:
        raise RuntimeError("split expects split_size be non-negative")
    sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    return split_with_sizes(self, sizes or [0], d)


@register(aten.split_with_sizes.default, aten.unsafe_split_with_sizes.default)
def split_with_sizes(self, split_sizes, dim=0):
    d = canonical_dim(dim, self.dim())
    if sum(split_sizes) != self.shape[d]:
        raise RuntimeError("split_with_sizes expects split_sizes to sum exactly to "
                           f"{self.shape[d]}, but got {list(split_sizes)}")
    out, start = [], 0
    for s in split_sizes:
        out.append(aten.slice.Tensor(self, d, start, start + s))
        start += s
    return out


@register(aten.unbind.int)
def unbind(self, dim=0):
    d = canonical_dim(dim, self.dim())
    return [aten.select.int(self, d, i) for i in range(self.shape[d])]


@register(aten.stack.default)
def stack(tensors, dim=0):
    d = canonical_dim(dim, tensors[0].dim() + 1)
    return aten.cat.default([aten.unsqueeze.default(t, d) for t in tensors], d)


@register(aten.repeat.default)
def repeat(self, repeats):
    if len(repeats) < self.dim():
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number "
                           "of dimensions of tensor")
    shape = [1] * (len(repeats) - self.dim()) + list(self.shape)
    # view as [1, s0, 1, s1, ...], expand to [r0, s0, r1, s1, ...], collapse pairs:
    # out[i * s + j] = x[j] along every dim.
    inter, big = [], []
    for r, s in zip(repeats, shape):
        inter += [1, s]
        big += [r, s]
    x = aten.expand.default(aten.reshape.default(self, inter), big)
    x = aten.clone.default(x, memory_format=torch.contiguous_format)
    return aten.view.default(x, [r * s for r, s in zip(repeats, shape)])


@register(aten.flip.default)
def flip(self, dims):
    dims = canonical_dims(dims, self.dim()) if len(dims) else []
    if len(set(dims)) != len(dims):
        raise RuntimeError("dims has duplicates")
    out = self
    for d in dims:
        n = self.shape[d]
        idx = aten.arange.start_step(n - 1, -1, -1, dtype=torch.int64, device=self.device)
        out = aten._unsafe_index.Tensor(out, [None] * d + [idx])   # in range: unchecked
    return out if dims else aten.clone.default(self)


@register(aten.roll.default)
def roll(self, shifts, dims=()):
    if len(dims) == 0:
        flat = aten.reshape.default(self, [-1])
        return aten.view.default(roll(flat, shifts, [0]), list(self.shape))
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    out = self
    for s, d in zip(shifts, dims):
        d = canonical_dim(d, self.dim())
        n = self.shape[d]
        if n == 0:
            continue
        s = s % n
        if s == 0:
            continue
        out = aten.cat.default([aten.slice.Tensor(out, d, n - s, n), aten.slice.Tensor(out, d, 0, n - s)], d)
    return out if out is not self else aten.clone.default(self)


def _edge_pad(x, padding, edge):
    """Reflection / replication padding of the last len(padding) // 2 dims as a tree of cats of
    views of x, outer dim first: each part along a dim pads the dims inside it, so every leaf is a
    view (flipped slice, or an expanded edge) read once. The tree fuses into one kernel whose
    loops are split where the parts meet (cpp_ranges: segments along W, unswitched H), each
    segment a plain strided copy; ATen's kernel computes the reflected index per element.
    edge(y, d, lo) -> the part before (lo) or after a dim d of y, or None for pads it leaves to
    ATen."""
    k = len(padding) // 2
    dims = list(range(x.dim() - k, x.dim()))
    pads = {d: (padding[2 * (x.dim() - 1 - d)], padding[2 * (x.dim() - 1 - d) + 1]) for d in dims}
    if any(p < 0 or p >= x.shape[d] for d in dims for p in pads[d]) or x.numel() == 0:
        return NotImplemented               # ATen's errors and negative pads (crops)

    def build(y, i):
        if i == len(dims):
            return y
        d = dims[i]
        parts = [edge(y, d, pads[d][0], True), y, edge(y, d, pads[d][1], False)]
        parts = [build(t, i + 1) for t in parts if t is not None]
        return parts[0] if len(parts) == 1 else aten.cat.default(parts, d)
    out = build(x, 0)
    return in_format_of(aten.clone.default(out) if out is x else out, x)


def _reflect_part(y, d, p, before):
    n = y.shape[d]
    if p == 0:
        return None
    part = aten.slice.Tensor(y, d, 1, p + 1) if before else aten.slice.Tensor(y, d, n - 1 - p, n - 1)
    return aten.flip.default(part, [d])


def _replicate_part(y, d, p, before):
    n = y.shape[d]
    if p == 0:
        return None
    part = aten.slice.Tensor(y, d, 0, 1) if before else aten.slice.Tensor(y, d, n - 1, n)
    size = list(y.shape)
    size[d] = p
    return aten.expand.default(part, size)


@register(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
          aten.reflection_pad3d.default)
def reflection_pad(self, padding):
    return _edge_pad(self, padding, _reflect_part)


@register(aten.replication_pad1d.default, aten.replication_pad2d.default,
          aten.replication_pad3d.default)
def replication_pad(self, padding):
    return _edge_pad(self, padding, _replicate_part)


def _edge_pad_backward(grad, x, padding, fold):
    """The gradient of `_edge_pad` as a gather: along each padded dim (of size n, pads lo, hi) the
    input's gradient is the grad's middle slice plus its edge parts folded back onto the rows
    they were read from (fold(g, d, n, lo, hi) -> the folded parts, each zero-padded to n), so
    the whole backward is adds of zero-padded slices: one pointwise kernel, its loops split where
    the parts meet. ATen's kernel zero-fills the result and adds every grad element at a
    computed index (reflect_pad's backward took 8x its forward's time). Sums are in another
    order than ATen's where two parts meet (a corner): within float rounding."""
    k = len(padding) // 2
    dims = list(range(x.dim() - k, x.dim()))
    pads = {d: (padding[2 * (x.dim() - 1 - d)], padding[2 * (x.dim() - 1 - d) + 1]) for d in dims}
    if (any(p < 0 or p >= x.shape[d] for d in dims for p in pads[d]) or x.numel() == 0
            or tuple(grad.shape) != tuple(x.shape[:x.dim() - k]) + tuple(
                x.shape[d] + sum(pads[d]) for d in dims)):
        return NotImplemented
    g = grad
    for d in dims:
        n, (lo, hi) = x.shape[d], pads[d]
        parts = [aten.slice.Tensor(g, d, lo, lo + n)] + fold(g, d, n, lo, hi)
        g = parts[0]
        for t in parts[1:]:
            g = aten.add.Tensor(g, t)
    out = in_format_of(g, x)
    if x.is_contiguous() and not out.is_contiguous():
        out = aten.clone.default(out, memory_format=torch.contiguous_format)
    return aten.clone.default(out) if out is grad else out


def _reflect_fold(g, d, n, lo, hi):
    """Output rows lo-1..0 were read from input rows 1..lo, rows lo+n.. from n-2 down."""
    out = []
    if lo:
        out.append(_pad_dim(aten.flip.default(aten.slice.Tensor(g, d, 0, lo), [d]), g.dim(), d,
                            1, n - 1 - lo))
    if hi:
        out.append(_pad_dim(aten.flip.default(aten.slice.Tensor(g, d, lo + n, lo + n + hi), [d]),
                            g.dim(), d, n - 1 - hi, 1))
    return out


def _replicate_fold(g, d, n, lo, hi):
    """Output rows before the input were read from its row 0, those after from row n-1: their
    sum (unrolled, in row order) goes to that row."""
    out = []
    for start, count, at in ((0, lo, 0), (lo + n, hi, n - 1)):
        if count:
            rows = [aten.slice.Tensor(g, d, start + j, start + j + 1) for j in range(count)]
            total = rows[0]
            for r in rows[1:]:
                total = aten.add.Tensor(total, r)
            out.append(_pad_dim(total, g.dim(), d, at, n - 1 - at))
    return out


@register(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
          aten.reflection_pad3d_backward.default)
def reflection_pad_backward(grad_output, self, padding):
    return _edge_pad_backward(grad_output, self, padding, _reflect_fold)


@register(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
          aten.replication_pad3d_backward.default)
def replication_pad_backward(grad_output, self, padding):
    if max(padding) > 16:                   # an unrolled sum per edge row: long pads stay ATen's
        return NotImplemented
    return _edge_pad_backward(grad_output, self, padding, _replicate_fold)


def _tri_mask(self, diagonal, lower):
    h, w = self.shape[-2], self.shape[-1]
    rows = aten.unsqueeze.default(_arange(h, self), -1)
    cols = aten.unsqueeze.default(_arange(w, self), 0)
    diff = aten.sub.Tensor(cols, rows)
    return aten.le.Scalar(diff, diagonal) if lower else aten.ge.Scalar(diff, diagonal)


@register(aten.tril.default)
def tril(self, diagonal=0):
    return where(_tri_mask(self, diagonal, True), self, 0)


@register(aten.triu.default)
def triu(self, diagonal=0):
    return where(_tri_mask(self, diagonal, False), self, 0)


def _pad_dim(x, ndim, dim, before, after):
    pads = [0, 0] * (ndim - 1 - dim) + [before, after]
    return aten.constant_pad_nd.default(x, pads, 0)


@register(aten.select_backward.default)
def select_backward(grad_output, input_sizes, dim, index):
    nd = len(input_sizes)
    d = canonical_dim(dim, nd)
    i = index % input_sizes[d]
    g = aten.unsqueeze.default(grad_output, d)
    return _pad_dim(g, nd, d, i, input_sizes[d] - i - 1)


def _slice_bounds(size, start, end):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


@register(aten.slice_backward.default)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    nd = len(input_sizes)
    d = canonical_dim(dim, nd)
    start, end = _slice_bounds(input_sizes[d], start, end)
    if step == 1:
        return _pad_dim(grad_output, nd, d, start, input_sizes[d] - end)
    zeros = aten.full.default(list(input_sizes), 0, dtype=grad_output.dtype, device=grad_output.device)
    idx = aten.arange.start_step(start, end, step, dtype=torch.int64, device=grad_output.device)
    return aten.index_put.default(zeros, [None] * d + [idx], grad_output)


@register(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    d = canonical_dim(dim, self.dim())
    start, end = _slice_bounds(self.shape[d], start, end)
    idx = aten.arange.start_step(start, end, step, dtype=torch.int64, device=self.device)
    return aten.index_put.default(self, [None] * d + [idx], src)


@register(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    d = canonical_dim(dim, self.dim())
    i = index % self.shape[d] if self.shape[d] else index
    shape = [1] * self.dim()
    shape[d] = self.shape[d]
    mask = aten.view.default(aten.eq.Scalar(_arange(self.shape[d], self), i), shape)
    return aten.where.self(mask, aten.unsqueeze.default(src, d), self)


def _diag_geometry(self, offset, dim1, dim2):
    nd = self.dim()
    d1, d2 = canonical_dim(dim1, nd), canonical_dim(dim2, nd)
    if d1 == d2:
        raise RuntimeError("diagonal dimensions cannot be identical")
    if offset >= 0:
        n = max(min(self.shape[d1], self.shape[d2] - offset), 0)
    else:
        n = max(min(self.shape[d1] + offset, self.shape[d2]), 0)
    return d1, d2, n


@register(aten.diagonal.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    d1, d2, n = _diag_geometry(self, offset, dim1, dim2)
    st = self.stride()
    storage_offset = self.storage_offset()
    if n > 0:
        storage_offset += offset * st[d2] if offset >= 0 else -offset * st[d1]
    sizes = [s for i, s in enumerate(self.shape) if i not in (d1, d2)] + [n]
    strides = [s for i, s in enumerate(st) if i not in (d1, d2)] + [st[d1] + st[d2]]
    return aten.as_strided.default(self, sizes, strides, storage_offset)


@register(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2, n = _diag_geometry(self, offset, dim1, dim2)
    i = _arange(n, self)
    r = aten.add.Tensor(i, max(-offset, 0))
    c = aten.add.Tensor(i, max(offset, 0))
    # move d1, d2 to the front, index_put, move back
    others = [k for k in range(self.dim()) if k not in (d1, d2)]
    perm = [d1, d2] + others
    x = aten.permute.default(self, perm)
    srcp = aten.permute.default(src, [src.dim() - 1] + list(range(src.dim() - 1)))
    y = aten.index_put.default(x, [r, c], srcp)
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return aten.permute.default(y, inv)


@register(aten.diagonal_backward.default)
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    zeros = aten.full.default(list(input_sizes), 0, dtype=grad_output.dtype, device=grad_output.device)
    return diagonal_scatter(zeros, grad_output, offset, dim1, dim2)


@register(aten.unfold.default)
def unfold(self, dimension, size, step):
    nd = self.dim()
    if nd == 0:
        return aten.as_strided.default(self, [size], [1], self.storage_offset())
    d = canonical_dim(dimension, nd)
    n = (self.shape[d] - size) // step + 1
    st = list(self.stride())
    sizes = list(self.shape)
    sizes[d] = n
    strides = list(st)
    strides[d] = st[d] * step
    return aten.as_strided.default(self, sizes + [size], strides + [st[d]], self.storage_offset())


@register(aten.expand_copy.default)
def expand_copy(self, size, *, implicit=False):
    return aten.clone.default(aten.expand.default(self, size))


@register(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *b, c, h, w = self.shape
    oc = c // (r * r)
    x = aten.reshape.default(self, list(b) + [oc, r, r, h, w])
    nb = len(b)
    perm = list(range(nb)) + [nb, nb + 3, nb + 1, nb + 4, nb + 2]
    x = aten.clone.default(aten.permute.default(x, perm), memory_format=torch.contiguous_format)
    out = aten.view.default(x, list(b) + [oc, h * r, w * r])
    if self.dim() == 4 and oc > 1 and _channels_last(self):
        out = aten.clone.default(out, memory_format=torch.channels_last)   # as the CPU kernel
    return out


def _channels_last(t) -> bool:
    n, c, h, w = t.shape
    return c > 1 and h * w > 1 and t.stride() == (c * h * w, 1, w * c, c)


@register(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *b, c, h, w = self.shape
    nb = len(b)
    x = aten.reshape.default(self, list(b) + [c, h // r, r, w // r, r])
    perm = list(range(nb)) + [nb, nb + 2, nb + 4, nb + 1, nb + 3]
    x = aten.clone.default(aten.permute.default(x, perm), memory_format=torch.contiguous_format)
    return aten.view.default(x, list(b) + [c * r * r, h // r, w // r])


# *_copy variants (what a functionalization pass may emit for views): the view, then clone.
def _copy_of(view_op):
    def fn(*args, **kwargs):
        out = view_op(*args, **kwargs)
        if isinstance(out, (list, tuple)):
            return [aten.clone.default(o) for o in out]
        return aten.clone.default(out)
    return fn


for _name, _view in [("view_copy.default", aten.view.default), ("permute_copy.default", aten.permute.default),
                     ("t_copy.default", aten.t.default), ("transpose_copy.int", aten.transpose.int),
                     ("unsqueeze_copy.default", aten.unsqueeze.default),
                     ("squeeze_copy.dims", aten.squeeze.dims), ("squeeze_copy.dim", aten.squeeze.dim),
                     ("squeeze_copy.default", aten.squeeze.default),
                     ("slice_copy.Tensor", aten.slice.Tensor), ("select_copy.int", aten.select.int),
                     ("alias_copy.default", aten.alias.default), ("as_strided_copy.default", aten.as_strided.default),
                     ("diagonal_copy.default", aten.diagonal.default), ("unbind_copy.int", aten.unbind.int),
                     ("split_copy.Tensor", aten.split.Tensor),
                     ("split_with_sizes_copy.default", aten.split_with_sizes.default),
                     ("unfold_copy.default", aten.unfold.default), ("detach_copy.default", aten.detach.default),
                     ("_unsafe_view.default", None)]:
    if _view is None:
        continue
    _packet, _ov = _name.split(".")
    if hasattr(aten, _packet) and hasattr(getattr(aten, _packet), _ov):
        register(getattr(getattr(aten, _packet), _ov))(_copy_of(_view))


@register(aten.reshape.default)
def reshape(self, shape, *stride):
    # CompositeImplicit ops called inside a decomposition reach the tracer undecomposed
    # (we are below autograd there), so reshape needs an entry of its own.
    if self.is_contiguous():
        return aten.view.default(self, shape)
    return aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), shape)
