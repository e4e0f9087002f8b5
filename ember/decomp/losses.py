"""Stage 3, decomp: loss functions (nll/nll2d, mse, bce, bce-with-logits, smooth-l1, huber)
and their backwards. `reduction`: 0 none, 1 mean, 2 sum (at::Reduction)."""
from __future__ import annotations

import torch

from ._util import opmath, scalar, to, where
from .registry import register

aten = torch.ops.aten
NONE, MEAN, SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == MEAN:  # empty input: 0 / 0 = nan, like eager
        return aten.div.Tensor(aten.sum.dim_IntList(loss, list(range(loss.dim()))), loss.numel())
    if reduction == SUM:
        return aten.sum.dim_IntList(loss, list(range(loss.dim())))
    return loss


def _nll_forward(self, target, weight, reduction, ignore_index):
    channel_dim = 0 if self.dim() < 2 else 1
    if weight is not None:
        if self.dim() > 1:
            shape = [1] * self.dim()
            shape[channel_dim] = weight.shape[0]
            w = aten.view.default(weight, shape)
        else:
            w = weight
        self = aten.mul.Tensor(self, w)
    valid = aten.ne.Scalar(target, ignore_index)
    safe_target = where(valid, target, 0)
    picked = aten.gather.default(self, channel_dim, aten.unsqueeze.default(safe_target, channel_dim))
    result = where(valid, aten.neg.default(aten.squeeze.dims(picked, [channel_dim])), 0)
    if reduction == NONE and self.dim() > 1:
        return result, aten.full.default([], 0.0, dtype=self.dtype, device=self.device)
    if weight is not None:
        w = aten.expand.default(w, list(self.shape))
        wsum = aten.gather.default(w, channel_dim, aten.unsqueeze.default(safe_target, channel_dim))
        wsum = where(valid, aten.squeeze.dims(wsum, [channel_dim]), 0)
        total_weight = aten.sum.dim_IntList(wsum, list(range(wsum.dim())))
    else:
        total_weight = to(aten.sum.dim_IntList(valid, list(range(valid.dim()))), self.dtype)
    if reduction == SUM:
        result = aten.sum.dim_IntList(result, list(range(result.dim())))
    elif reduction == MEAN:
        result = aten.div.Tensor(aten.sum.dim_IntList(result, list(range(result.dim()))), total_weight)
    return result, total_weight


@register(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@register(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    channel_dim = 0 if self.dim() < 2 else 1
    if reduction == MEAN:
        grad_output = aten.div.Tensor(grad_output, total_weight)
    if self.dim() == 1 and target.dim() > 0:
        target = aten.select.int(target, 0, 0)
    target = aten.unsqueeze.default(target, channel_dim)
    valid = aten.ne.Scalar(target, ignore_index)
    safe_target = where(valid, target, 0)
    grad_input = aten.full.default(list(self.shape), 0, dtype=self.dtype, device=self.device)
    grad_input = aten.scatter.value(grad_input, channel_dim, safe_target, -1.0)
    if grad_input.dim() > grad_output.dim() > 0:
        grad_output = aten.unsqueeze.default(grad_output, channel_dim)
    if weight is not None:
        shape = [1] * self.dim()
        shape[channel_dim] = weight.shape[0]
        grad_output = aten.mul.Tensor(grad_output, aten.view.default(weight, shape))
    grad_output = where(valid, grad_output, 0)
    return aten.mul.Tensor(grad_input, grad_output)


@register(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@register(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@register(aten.mse_loss.default)
@opmath
def mse_loss(self, target, reduction=MEAN):
    d = aten.sub.Tensor(self, target)
    return _reduce(aten.mul.Tensor(d, d), reduction)


@register(aten.mse_loss_backward.default)
@opmath
def mse_loss_backward(grad_output, self, target, reduction):
    norm = 2.0 / self.numel() if reduction == MEAN else 2.0
    return aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(self, target), norm), grad_output)


@register(aten.binary_cross_entropy.default)
@opmath
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    floor = scalar(-100.0, self)
    log_1m = aten.maximum.default(aten.log1p.default(aten.neg.default(self)), floor)
    log_p = aten.maximum.default(aten.log.default(self), floor)
    loss = aten.sub.Tensor(aten.mul.Tensor(aten.sub.Tensor(target, 1), log_1m),
                           aten.mul.Tensor(target, log_p))
    if weight is not None:
        loss = aten.mul.Tensor(loss, weight)
    return _reduce(loss, reduction)


@register(aten.binary_cross_entropy_backward.default)
@opmath
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    denom = aten.maximum.default(aten.mul.Tensor(self, aten.sub.Tensor(1, self)), scalar(1e-12, self))
    result = aten.div.Tensor(aten.mul.Tensor(grad_output, aten.sub.Tensor(self, target)), denom)
    if weight is not None:
        result = aten.mul.Tensor(result, weight)
    if reduction == MEAN:
        result = aten.div.Tensor(result, self.numel())
    return result


def _log_sigmoid(x):
    # min(x, 0) - log1p(exp(-|x|))
    return aten.sub.Tensor(where(aten.lt.Scalar(x, 0), x, 0),
                           aten.log1p.default(aten.exp.default(aten.neg.default(aten.abs.default(x)))))


@register(aten.binary_cross_entropy_with_logits.default)
@opmath
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=MEAN):
    if pos_weight is not None:
        log_weight = aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(pos_weight, 1), target), 1)
        loss = aten.sub.Tensor(aten.mul.Tensor(aten.sub.Tensor(1, target), self),
                               aten.mul.Tensor(log_weight, _log_sigmoid(self)))
    else:
        loss = aten.sub.Tensor(aten.mul.Tensor(aten.sub.Tensor(1, target), self), _log_sigmoid(self))
    if weight is not None:
        loss = aten.mul.Tensor(loss, weight)
    return _reduce(loss, reduction)


@register(aten.smooth_l1_loss.default)
@opmath
def smooth_l1_loss(self, target, reduction=MEAN, beta=1.0):
    z = aten.abs.default(aten.sub.Tensor(self, target))
    if beta == 0:
        loss = z
    else:
        loss = where(aten.lt.Scalar(z, beta), aten.div.Tensor(aten.mul.Tensor(aten.mul.Tensor(z, z), 0.5), beta),
                     aten.sub.Tensor(z, 0.5 * beta))
    return _reduce(loss, reduction)


@register(aten.smooth_l1_loss_backward.default)
@opmath
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    norm = 1.0 / self.numel() if reduction == MEAN else 1.0
    x = aten.sub.Tensor(self, target)
    abs_x = aten.abs.default(x)
    norm_grad = aten.mul.Tensor(grad_output, norm)
    inner = aten.div.Tensor(aten.mul.Tensor(x, norm_grad), beta) if beta != 0 else aten.mul.Tensor(x, 0)
    return where(aten.lt.Scalar(abs_x, beta), inner, aten.mul.Tensor(aten.sign.default(x), norm_grad))


@register(aten.huber_loss.default)
@opmath
def huber_loss(self, target, reduction=MEAN, delta=1.0):
    z = aten.abs.default(aten.sub.Tensor(self, target))
    loss = where(aten.lt.Scalar(z, delta), aten.mul.Tensor(aten.mul.Tensor(z, z), 0.5),
                 aten.mul.Tensor(aten.sub.Tensor(z, 0.5 * delta), delta))
    return _reduce(loss, reduction)


@register(aten.huber_loss_backward.default)
@opmath
def huber_loss_backward(grad_output, self, target, reduction, delta):
    norm = 1.0 / self.numel() if reduction == MEAN else 1.0
    x = aten.sub.Tensor(self, target)
    g = aten.mul.Tensor(grad_output, norm)
    lo = where(aten.lt.Scalar(x, -delta), aten.mul.Tensor(g, -delta), aten.mul.Tensor(x, g))
    return where(aten.gt.Scalar(x, delta), aten.mul.Tensor(g, delta), lo)
