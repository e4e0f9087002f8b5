"""Stage 3, decomp: pointwise ops outside PRIMS → pointwise prims.

Scalar overloads become their `.Tensor` prims (a Python scalar, or a 0-dim tensor whose dtype is
the op's result dtype); clamp/masked_fill/where variants/addcmul/addcdiv/lerp/logical ops/etc.
Result dtypes follow eager type promotion (computed in _util: torch.result_type and
torch.promote_types are themselves aten ops and would be traced).
"""
from __future__ import annotations

import math

import torch

from ._util import opmath, promote, scalar, scalar_result_dtype, to, where
from .registry import register

aten = torch.ops.aten


def _num(value, like, dtype=None):
    """A 0-dim tensor holding a Python number, typed as eager would promote `like op value`."""
    return aten.full.default([], value, dtype=dtype or scalar_result_dtype(like.dtype, value),
                             device=like.device)


# ------------------------------------------------------------------------- scalar overloads

@register(aten.add.Scalar)
def add_scalar(self, other, alpha=1):
    return aten.add.Tensor(self, other, alpha=alpha)


@register(aten.sub.Scalar)
def sub_scalar(self, other, alpha=1):
    return aten.sub.Tensor(self, other, alpha=alpha)


@register(aten.mul.Scalar)
def mul_scalar(self, other):
    return aten.mul.Tensor(self, other)


@register(aten.div.Scalar)
def div_scalar(self, other):
    return aten.div.Tensor(self, other)


@register(aten.div.Scalar_mode)
def div_scalar_mode(self, other, rounding_mode=None):
    return aten.div.Tensor_mode(self, _num(other, self), rounding_mode=rounding_mode)


@register(aten.rsub.Tensor)
def rsub_tensor(self, other, alpha=1):
    return aten.sub.Tensor(other, self, alpha=alpha)


@register(aten.rsub.Scalar)
def rsub_scalar(self, other, alpha=1):
    return aten.sub.Tensor(_num(other, self), self, alpha=alpha)


@register(aten.floor_divide.default)
def floor_divide(self, other):
    return aten.div.Tensor_mode(self, other, rounding_mode="floor")


@register(aten.floor_divide.Scalar)
def floor_divide_scalar(self, other):
    return aten.div.Tensor_mode(self, _num(other, self), rounding_mode="floor")


@register(aten.pow.Scalar)
def pow_scalar(self, exponent):
    return aten.pow.Tensor_Tensor(_num(self, exponent), exponent)


for _op, _t in ((aten.remainder, aten.remainder.Tensor), (aten.fmod, aten.fmod.Tensor),
                (aten.bitwise_and, aten.bitwise_and.Tensor), (aten.bitwise_or, aten.bitwise_or.Tensor),
                (aten.bitwise_xor, aten.bitwise_xor.Tensor)):
    def _scalar(self, other, _t=_t):
        return _t(self, _num(other, self))

    def _scalar_tensor(self, other, _t=_t):
        return _t(_num(self, other), other)
    register(_op.Scalar)(_scalar)
    if hasattr(_op, "Scalar_Tensor"):
        register(_op.Scalar_Tensor)(_scalar_tensor)


# ------------------------------------------------------------------------------ clamp family

def _bound(value, x):
    if isinstance(value, torch.Tensor):
        return value
    return _num(value, x)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(self, min=None, max=None):
    out = self
    if min is not None:
        out = aten.maximum.default(out, _bound(min, self))
    if max is not None:
        out = aten.minimum.default(out, _bound(max, self))
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return out


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):
    return aten.maximum.default(self, _bound(min, self))


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):
    return aten.minimum.default(self, _bound(max, self))


@register(aten.masked_fill.Scalar)
def masked_fill_scalar(self, mask, value):
    return aten.where.self(mask, scalar(value, self), self)


@register(aten.masked_fill.Tensor)
def masked_fill_tensor(self, mask, value):
    return aten.where.self(mask, to(value, self.dtype), self)


@register(aten.where.ScalarOther)
def where_scalar_other(condition, self, other):
    return aten.where.self(condition, self, _num(other, self))


@register(aten.where.ScalarSelf)
def where_scalar_self(condition, self, other):
    return aten.where.self(condition, _num(self, other), other)


def _py_dtype(v):
    if isinstance(v, (bool, torch.SymBool)):
        return torch.bool
    if isinstance(v, (int, torch.SymInt)):
        return torch.int64
    if isinstance(v, complex):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return torch.get_default_dtype()


@register(aten.where.Scalar)
def where_scalar(condition, self, other):
    dtype = promote(_py_dtype(self), _py_dtype(other))
    return aten.where.self(condition, _num(self, condition, dtype), _num(other, condition, dtype))


# --------------------------------------------------------------------------- fused pointwise

@register(aten.addcmul.default)
@opmath
def addcmul(self, tensor1, tensor2, value=1):
    return aten.add.Tensor(self, aten.mul.Tensor(aten.mul.Tensor(tensor1, tensor2), value))


@register(aten.addcdiv.default)
@opmath
def addcdiv(self, tensor1, tensor2, value=1):
    return aten.add.Tensor(self, aten.mul.Tensor(aten.div.Tensor(tensor1, tensor2), value))


@register(aten.lerp.Scalar, aten.lerp.Tensor)
@opmath
def lerp(start, end, weight):
    diff = aten.sub.Tensor(end, start)
    if isinstance(weight, torch.Tensor):
        lo = aten.add.Tensor(start, aten.mul.Tensor(weight, diff))
        hi = aten.sub.Tensor(end, aten.mul.Tensor(diff, aten.sub.Tensor(1, weight)))
        small = aten.lt.Scalar(aten.abs.default(weight), 0.5)
        return aten.where.self(small, lo, hi)
    if abs(weight) < 0.5:
        return aten.add.Tensor(start, aten.mul.Tensor(diff, weight))
    return aten.sub.Tensor(end, aten.mul.Tensor(diff, 1 - weight))


# ------------------------------------------------------------------------------------ logic

def _truthy(x):
    return x if x.dtype == torch.bool else aten.ne.Scalar(x, 0)


@register(aten.logical_not.default)
def logical_not(self):
    return aten.eq.Scalar(self, 0) if self.dtype != torch.bool else aten.bitwise_not.default(self)


@register(aten.logical_and.default)
def logical_and(self, other):
    return aten.bitwise_and.Tensor(_truthy(self), _truthy(other))


@register(aten.logical_or.default)
def logical_or(self, other):
    return aten.bitwise_or.Tensor(_truthy(self), _truthy(other))


@register(aten.logical_xor.default)
def logical_xor(self, other):
    return aten.bitwise_xor.Tensor(_truthy(self), _truthy(other))


# ------------------------------------------------------------------------------- misc math

@register(aten.sgn.default)
def sgn(self):
    if self.is_complex():
        return NotImplemented  # z / |z|: complex stays an aten call
    return aten.sign.default(self)


@register(aten.frac.default)
def frac(self):
    return aten.sub.Tensor(self, aten.trunc.default(self))


@register(aten.isinf.default)
def isinf(self):
    if not self.is_floating_point():
        return aten.full.default(list(self.shape), False, dtype=torch.bool, device=self.device)
    return aten.eq.Scalar(aten.abs.default(self), float("inf"))


@register(aten.isposinf.default)
def isposinf(self):
    return aten.eq.Scalar(self, float("inf"))


@register(aten.isneginf.default)
def isneginf(self):
    return aten.eq.Scalar(self, float("-inf"))


@register(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not self.is_floating_point():
        return aten.clone.default(self)
    fi = torch.finfo(self.dtype)
    out = where(aten.isnan.default(self), 0.0 if nan is None else nan, self)
    out = where(aten.eq.Scalar(self, float("inf")), fi.max if posinf is None else posinf, out)
    return where(aten.eq.Scalar(self, float("-inf")), fi.min if neginf is None else neginf, out)


@register(aten.xlogy.Tensor)
def xlogy(self, other):
    dtype = promote(self.dtype, other.dtype) if isinstance(other, torch.Tensor) \
        else scalar_result_dtype(self.dtype, other)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x, y = to(self, dtype), to(other, dtype)
    out = where(aten.eq.Scalar(x, 0), 0, aten.mul.Tensor(x, aten.log.default(y)))
    return where(aten.isnan.default(y), float("nan"), out)


@register(aten.logaddexp.default)
@opmath
def logaddexp(self, other):
    m = aten.maximum.default(self, other)
    d = aten.abs.default(aten.sub.Tensor(self, other))
    out = aten.add.Tensor(m, aten.log1p.default(aten.exp.default(aten.neg.default(d))))
    both_inf = aten.bitwise_and.Tensor(aten.eq.Tensor(self, other), aten.eq.Scalar(aten.abs.default(self), float("inf")))
    return aten.where.self(both_inf, self, out)


@register(aten.deg2rad.default)
def deg2rad(self):
    return aten.mul.Tensor(self, math.pi / 180)


@register(aten.rad2deg.default)
def rad2deg(self):
    return aten.mul.Tensor(self, 180 / math.pi)


@register(aten.sinc.default)
@opmath
def sinc(self):
    px = aten.mul.Tensor(self, math.pi)
    return where(aten.eq.Scalar(self, 0), 1.0, aten.div.Tensor(aten.sin.default(px), px))


@register(aten.heaviside.default)
def heaviside(self, values):
    pos = to(aten.gt.Scalar(self, 0), promote(self.dtype, values.dtype))
    return aten.where.self(aten.eq.Scalar(self, 0), to(values, pos.dtype), pos)


@register(aten.fmax.default)
def fmax(self, other):
    m = aten.maximum.default(self, other)
    if not m.is_floating_point():
        return m
    m = aten.where.self(aten.isnan.default(other), to(self, m.dtype), m)
    return aten.where.self(aten.isnan.default(self), to(other, m.dtype), m)


@register(aten.fmin.default)
def fmin(self, other):
    m = aten.minimum.default(self, other)
    if not m.is_floating_point():
        return m
    m = aten.where.self(aten.isnan.default(other), to(self, m.dtype), m)
    return aten.where.self(aten.isnan.default(self), to(other, m.dtype), m)


@register(aten.round.decimals)
def round_decimals(self, decimals=0):
    if decimals == 0:
        return aten.round.default(self)
    if decimals > 0:
        p = 10.0 ** decimals
        return aten.div.Tensor(aten.round.default(aten.mul.Tensor(self, p)), p)
    p = 10.0 ** (-decimals)
    return aten.mul.Tensor(aten.round.default(aten.div.Tensor(self, p)), p)


@register(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    return where(aten.le.Scalar(aten.abs.default(self), lambd), 0, self)


@register(aten.hardshrink_backward.default, aten.softshrink_backward.default)
def shrink_backward(grad_out, self, lambd):
    return where(aten.le.Scalar(aten.abs.default(self), lambd), 0, grad_out)


@register(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    return where(aten.gt.Scalar(self, lambd), aten.sub.Tensor(self, lambd),
                 where(aten.lt.Scalar(self, -lambd), aten.add.Tensor(self, lambd), aten.mul.Tensor(self, 0)))


@register(aten.fill.Scalar)
def fill_scalar(self, value):
    return aten.full.default(list(self.shape), value, dtype=self.dtype, device=self.device)


@register(aten.fill.Tensor)
def fill_tensor(self, value):
    return aten.copy.default(self, value)


@register(aten.zero.default)
def zero(self):
    return aten.full.default(list(self.shape), 0, dtype=self.dtype, device=self.device)
