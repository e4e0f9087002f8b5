"""Stage 3, decomp: tensor factories (zeros/ones/*_like/new_*/arange/linspace/eye) → full,
arange.start_step, empty; random ops (rand_like, bernoulli, dropout, uniform) → rand/randn."""
from __future__ import annotations

import torch

from ._util import channels_last, to
from .registry import register

aten = torch.ops.aten


def _dev(device, like=None):
    return device if device is not None else (like.device if like is not None else torch.device("cpu"))


def _dt(dtype, like=None):
    return dtype if dtype is not None else (like.dtype if like is not None else torch.get_default_dtype())


def _full(size, value, dtype, device):
    return aten.full.default(list(size), value, dtype=dtype, device=device)


@register(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, _dt(dtype), _dev(device))


@register(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 1, _dt(dtype), _dev(device))


def _like(value):
    def fn(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return _filled_like(self, value, _dt(dtype, self), _dev(device, self), memory_format)
    return fn


def _dense_order(t):
    """`t`'s dims outermost first when it is dense and non-overlapping in a permuted order
    (not contiguous), else None: eager's *_like with preserve_format then keeps its strides."""
    if any(not isinstance(n, int) for n in (*t.shape, *t.stride())) or t.is_contiguous():
        return None
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d]), reverse=True)
    expect = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride(d) != expect:
            return None
        expect *= t.shape[d]
    return order


def _filled_like(self, value, dtype, device, memory_format):
    """full(self.shape, value) in the layout eager's *_like gives: a permuted dense input's
    strides (HF MRA views the permute of a zeros_like of a transpose: made contiguous, the
    view failed in the trace), channels_last, or an explicit memory format."""
    order = _dense_order(self) if memory_format in (None, torch.preserve_format) else None
    if order is not None and not channels_last(self):
        out = _full([self.shape[d] for d in order], value, dtype, device)
        return aten.permute.default(out, [order.index(d) for d in range(self.dim())])
    return _strided_like(self, _full(self.shape, value, dtype, device), memory_format)


def _strided_like(self, out, memory_format):
    """Eager *_like with preserve_format keeps a channels_last input's layout."""
    if memory_format in (None, torch.preserve_format) and channels_last(self):
        return aten.clone.default(out, memory_format=torch.channels_last)
    if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
        return aten.clone.default(out, memory_format=memory_format)
    return out


register(aten.zeros_like.default)(_like(0))
register(aten.ones_like.default)(_like(1))


@register(aten.full_like.default)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return _filled_like(self, fill_value, _dt(dtype, self), _dev(device, self), memory_format)


@register(aten.empty_like.default)
def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dt, dev = _dt(dtype, self), _dev(device, self)
    order = _dense_order(self) if memory_format in (None, torch.preserve_format) else None
    if order is not None and not channels_last(self):
        out = aten.empty.memory_format([self.shape[d] for d in order], dtype=dt, device=dev)
        return aten.permute.default(out, [order.index(d) for d in range(self.dim())])
    if memory_format in (None, torch.preserve_format) and channels_last(self):
        memory_format = torch.channels_last
    if memory_format in (None, torch.preserve_format):
        memory_format = torch.contiguous_format
    return aten.empty.memory_format(list(self.shape), dtype=dt, device=dev, memory_format=memory_format)


@register(aten.new_zeros.default)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, _dt(dtype, self), _dev(device, self))


@register(aten.new_ones.default)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 1, _dt(dtype, self), _dev(device, self))


@register(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, fill_value, _dt(dtype, self), _dev(device, self))


@register(aten.new_empty.default)
def new_empty(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.empty.memory_format(list(size), dtype=_dt(dtype, self), device=_dev(device, self))


@register(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.empty_strided.default(list(size), list(stride), dtype=_dt(dtype, self),
                                      device=_dev(device, self))


def _arange_dtype(start, end, step):
    if all(isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) for v in (start, end, step)):
        return torch.int64
    return torch.get_default_dtype()


@register(aten.arange.default)
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(0, end, 1, dtype=dtype or _arange_dtype(0, end, 1),
                                  device=_dev(device))


@register(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(start, end, 1, dtype=dtype or _arange_dtype(start, end, 1),
                                  device=_dev(device))


@register(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    dev = _dev(device)
    if steps == 0:
        return _full([0], 0, dtype, dev)
    if steps == 1:
        return _full([1], start, dtype, dev)
    if not dtype.is_floating_point:
        return NotImplemented
    # ATen: first half from start, second half from end (symmetric rounding)
    step = (end - start) / (steps - 1)
    i = aten.arange.start_step(0, steps, 1, dtype=dtype, device=dev)
    lo = aten.add.Tensor(aten.mul.Tensor(i, step), start)
    hi = aten.sub.Tensor(end, aten.mul.Tensor(aten.sub.Tensor(steps - 1, i), step))
    return aten.where.self(aten.lt.Scalar(i, steps // 2), lo, hi)


@register(aten.eye.default)
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return eye_m(n, n, dtype=dtype, device=device)


@register(aten.eye.m)
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    dev, dt = _dev(device), _dt(dtype)
    r = aten.unsqueeze.default(aten.arange.start_step(0, n, 1, dtype=torch.int64, device=dev), -1)
    c = aten.arange.start_step(0, m, 1, dtype=torch.int64, device=dev)
    return to(aten.eq.Tensor(r, c), dt)


# ------------------------------------------------------------------------------------- random

@register(aten.rand_like.default)
def rand_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.rand.default(list(self.shape), dtype=_dt(dtype, self), device=_dev(device, self))


@register(aten.randn_like.default)
def randn_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.randn.default(list(self.shape), dtype=_dt(dtype, self), device=_dev(device, self))


@register(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator=None):
    if generator is not None:
        return NotImplemented
    r = aten.rand.default(list(self.shape), dtype=torch.float32 if self.dtype != torch.float64 else torch.float64,
                          device=self.device)
    return to(aten.lt.Scalar(r, p), self.dtype)


@register(aten.bernoulli.default)
def bernoulli(self, *, generator=None):
    if generator is not None:
        return NotImplemented
    r = aten.rand.default(list(self.shape), dtype=self.dtype if self.is_floating_point() else torch.float32,
                          device=self.device)
    return to(aten.lt.Tensor(r, self), self.dtype)


@register(aten.bernoulli_.float)
def bernoulli_inplace(self, p=0.5, *, generator=None):
    out = bernoulli_p(self, p, generator=generator)
    if out is NotImplemented:
        return out
    return aten.copy_.default(self, out)


@register(aten.uniform.default)
def uniform(self, from_=0.0, to_=1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    r = aten.rand.default(list(self.shape), dtype=self.dtype, device=self.device)
    return aten.add.Tensor(aten.mul.Tensor(r, to_ - from_), from_)


@register(aten.native_dropout.default)
def native_dropout(input, p, train):
    if train is False or p == 0:
        return aten.clone.default(input), aten.full.default(list(input.shape), True, dtype=torch.bool,
                                                            device=input.device)
    if p == 1:
        return aten.mul.Tensor(input, 0), aten.full.default(list(input.shape), False, dtype=torch.bool,
                                                             device=input.device)
    keep = 1 - p
    r = aten.rand.default(list(input.shape), dtype=torch.float32 if input.dtype != torch.float64 else torch.float64,
                          device=input.device)
    mask = aten.lt.Scalar(r, keep)
    return aten.mul.Tensor(aten.mul.Tensor(input, mask), 1.0 / keep), mask


@register(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return aten.mul.Tensor(aten.mul.Tensor(grad_output, to(mask, grad_output.dtype)), scale)
