"""Stage 3, decomp: matmul-family ops outside the mm/bmm/addmm externs (dot, mv, addmv,
baddbmm, addbmm, addr, _addmm_activation). linear/matmul/einsum are CompositeImplicit and
arrive already as mm/bmm/addmm/views."""
from __future__ import annotations

import torch

from .registry import register

aten = torch.ops.aten


def _scale(x, s):
    return x if s == 1 else aten.mul.Tensor(x, s)


def _beta_term(self, beta, like):
    # beta == 0 ignores self (nan/inf in self do not propagate), like eager
    if beta == 0:
        return None
    return _scale(self, beta)


def _plus(term, prod):
    return prod if term is None else aten.add.Tensor(term, prod)


@register(aten.dot.default, aten.vdot.default)
def dot(self, other):
    if self.is_complex():
        return NotImplemented
    return aten.view.default(aten.mm.default(aten.view.default(self, [1, -1]),
                                             aten.view.default(other, [-1, 1])), [])


@register(aten.mv.default)
def mv(self, vec):
    return aten.view.default(aten.mm.default(self, aten.unsqueeze.default(vec, 1)), [self.shape[0]])


@register(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    out = _plus(_beta_term(self, beta, mat), _scale(mv(mat, vec), alpha))
    return aten.expand.default(out, [mat.shape[0]]) if out.dim() == 0 or out.shape[0] != mat.shape[0] else out


@register(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    out = _plus(_beta_term(self, beta, batch1), _scale(aten.bmm.default(batch1, batch2), alpha))
    shape = [batch1.shape[0], batch1.shape[1], batch2.shape[2]]
    return out if list(out.shape) == shape else aten.clone.default(aten.expand.default(out, shape))


@register(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    # one mm with K = b*m: [n, b*m] @ [b*m, p] (a single extern call, like eager's accumulation)
    b, n, m = batch1.shape
    lhs = aten.reshape.default(aten.permute.default(batch1, [1, 0, 2]), [n, b * m])
    prod = aten.mm.default(lhs, aten.reshape.default(batch2, [b * m, batch2.shape[2]]))
    out = _plus(_beta_term(self, beta, batch1), _scale(prod, alpha))
    shape = [batch1.shape[1], batch2.shape[2]]
    return out if list(out.shape) == shape else aten.clone.default(aten.expand.default(out, shape))


@register(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    outer = aten.mul.Tensor(aten.unsqueeze.default(vec1, 1), aten.unsqueeze.default(vec2, 0))
    if self.dtype == torch.bool:
        return NotImplemented
    out = _plus(_beta_term(self, beta, vec1), _scale(outer, alpha))
    shape = [vec1.shape[0], vec2.shape[0]]
    return out if list(out.shape) == shape else aten.clone.default(aten.expand.default(out, shape))


@register(aten._addmm_activation.default)
def addmm_activation(self, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    out = aten.addmm.default(self, mat1, mat2, beta=beta, alpha=alpha)
    return aten.gelu.default(out) if use_gelu else aten.relu.default(out)
