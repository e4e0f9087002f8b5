"""Stage 3, decomp: reductions outside PRIMS (mean, var/std, max/min, any/all, logsumexp,
vector norms, prod/sum over all dims) → sum/prod/amax/amin/argmax/argmin/var_mean."""
from __future__ import annotations

import torch

from ._util import canonical_dims, opmath_dtype, to, where
from .registry import register

aten = torch.ops.aten


def _dims(x, dim):
    return canonical_dims(dim, x.dim())


def _count(x, dims):
    if x.dim() == 0:
        return 1
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


@register(aten.sum.default)
def sum_all(self, dtype=None):
    return aten.sum.dim_IntList(self, list(range(self.dim())), False, dtype=dtype)


@register(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, dtype=None):
    x = where(aten.isnan.default(self), 0, self) if self.is_floating_point() else self
    return aten.sum.dim_IntList(x, _dims(self, dim), keepdim, dtype=dtype)


@register(aten.prod.default)
def prod_all(self, dtype=None):
    return aten.prod.dim_int(aten.reshape.default(self, [-1]), 0, False, dtype=dtype)


@register(aten.mean.default)
def mean_all(self, dtype=None):
    return mean_dim(self, None, False, dtype=dtype)


@register(aten.mean.dim)
def mean_dim(self, dim, keepdim=False, dtype=None):
    out_dtype = dtype or self.dtype
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                           f"floating point or complex dtype. Got: {out_dtype}")
    dims = _dims(self, dim)
    acc = opmath_dtype(out_dtype)
    s = aten.sum.dim_IntList(to(self, acc), dims, keepdim)
    return to(aten.div.Tensor(s, _count(self, dims)), out_dtype)


def _var_mean(x, dim, correction, keepdim):
    if correction is None:
        correction = 1
    return aten.var_mean.correction(x, dim, correction=correction, keepdim=keepdim)


@register(aten.var.correction)
def var(self, dim=None, correction=None, keepdim=False):
    return _var_mean(self, dim, correction, keepdim)[0]


@register(aten.std.correction)
def std(self, dim=None, correction=None, keepdim=False):
    return aten.sqrt.default(_var_mean(self, dim, correction, keepdim)[0])


@register(aten.std_mean.correction)
def std_mean(self, dim=None, correction=None, keepdim=False):
    v, m = _var_mean(self, dim, correction, keepdim)
    return aten.sqrt.default(v), m


@register(aten.max.default)
def max_all(self):
    return aten.amax.default(self, list(range(self.dim())))


@register(aten.min.default)
def min_all(self):
    return aten.amin.default(self, list(range(self.dim())))


def _arg_input(x):
    return to(x, torch.uint8) if x.dtype == torch.bool else x   # argmax/argmin reject bool


@register(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return aten.amax.default(self, [dim], keepdim), aten.argmax.default(_arg_input(self), dim, keepdim)


@register(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return aten.amin.default(self, [dim], keepdim), aten.argmin.default(_arg_input(self), dim, keepdim)


@register(aten.max.other)
def max_other(self, other):
    return aten.maximum.default(self, other)


@register(aten.min.other)
def min_other(self, other):
    return aten.minimum.default(self, other)


@register(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    dims = list(range(self.dim())) if dim is None else [dim]
    return aten.amin.default(self, dims, keepdim), aten.amax.default(self, dims, keepdim)


def _any(self, dims, keepdim):
    out = aten.amax.default(aten.ne.Scalar(self, 0) if self.dtype != torch.bool else self, dims, keepdim)
    return to(out, torch.uint8) if self.dtype == torch.uint8 else out


def _all(self, dims, keepdim):
    out = aten.amin.default(aten.ne.Scalar(self, 0) if self.dtype != torch.bool else self, dims, keepdim)
    return to(out, torch.uint8) if self.dtype == torch.uint8 else out


@register(aten.any.default)
def any_all(self):
    return _any(self, list(range(self.dim())), False) if self.numel() else \
        aten.full.default([], False, dtype=torch.uint8 if self.dtype == torch.uint8 else torch.bool, device=self.device)


@register(aten.any.dim)
def any_dim(self, dim, keepdim=False):
    return any_dims(self, [dim], keepdim)


@register(aten.any.dims)
def any_dims(self, dim=None, keepdim=False):
    dims = _dims(self, dim)
    if self.numel() == 0:
        return NotImplemented
    return _any(self, dims, keepdim)


@register(aten.all.default)
def all_all(self):
    return all_dims(self, None, False)


@register(aten.all.dim)
def all_dim(self, dim, keepdim=False):
    return all_dims(self, [dim], keepdim)


@register(aten.all.dims)
def all_dims(self, dim=None, keepdim=False):
    if self.numel() == 0:
        return NotImplemented
    return _all(self, _dims(self, dim), keepdim)


@register(aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim):
    return aten.sum.dim_IntList(aten.ne.Scalar(self, 0), _dims(self, dim), False, dtype=torch.int64)


@register(aten.count_nonzero.default)
def count_nonzero_default(self, dim=None):
    return count_nonzero(self, [] if dim is None else [dim])


@register(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    x = self if self.is_floating_point() else to(self, torch.get_default_dtype())
    dims = _dims(x, dim)
    if x.numel() == 0:
        return NotImplemented
    acc = opmath_dtype(x.dtype)
    xa = to(x, acc)
    m = aten.amax.default(xa, dims, True)
    m = where(aten.eq.Scalar(aten.abs.default(m), float("inf")), 0, m)
    s = aten.log.default(aten.sum.dim_IntList(aten.exp.default(aten.sub.Tensor(xa, m)), dims, keepdim))
    if not keepdim:
        m = aten.squeeze.dims(m, dims)
    return to(aten.add.Tensor(s, m), x.dtype)


@register(aten.linalg_vector_norm.default)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = to(self, dtype) if dtype is not None else self
    dims = _dims(x, dim)
    if x.numel() == 0 and ord < 0 or x.is_complex():
        return NotImplemented
    out_dtype = x.dtype
    xa = to(x, opmath_dtype(x.dtype))
    a = aten.abs.default(xa)
    if ord == float("inf"):
        out = aten.amax.default(a, dims, keepdim) if x.numel() else NotImplemented
    elif ord == float("-inf"):
        out = aten.amin.default(a, dims, keepdim) if x.numel() else NotImplemented
    elif ord == 0:
        out = aten.sum.dim_IntList(to(aten.ne.Scalar(xa, 0), xa.dtype), dims, keepdim)
    elif ord == 1:
        out = aten.sum.dim_IntList(a, dims, keepdim)
    elif ord == 2:
        out = aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(a, a), dims, keepdim))
    else:
        out = aten.pow.Tensor_Scalar(aten.sum.dim_IntList(aten.pow.Tensor_Scalar(a, ord), dims, keepdim),
                                     1.0 / ord)
    if out is NotImplemented:
        return out
    return to(out, out_dtype)


def _norm(self, p=2, dim=None, keepdim=False, dtype=None):
    return linalg_vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@register(aten.norm.Scalar)
def norm_scalar(self, p=2):
    return _norm(self, p)


@register(aten.norm.ScalarOpt_dim)
def norm_scalaropt_dim(self, p, dim, keepdim=False):
    return _norm(self, p, dim, keepdim)


@register(aten.norm.ScalarOpt_dim_dtype)
def norm_scalaropt_dim_dtype(self, p, dim, keepdim, *, dtype):
    return _norm(self, p, dim, keepdim, dtype)


@register(aten.norm.ScalarOpt_dtype)
def norm_scalaropt_dtype(self, p, *, dtype):
    return _norm(self, p, None, False, dtype)
