"""Stage 3, decomp: activation functions and their backwards → pointwise prims.

Formulas follow ATen's kernels (CPU activation.cpp); fp16/bf16 compute in fp32 (`opmath`).
"""
from __future__ import annotations

import math

import torch

from ._util import on_cpu, opmath, scalar, where
from .registry import register

aten = torch.ops.aten
add, sub, mul, div = aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor


@register(aten.relu.default)
def relu(x):
    return where(aten.le.Scalar(x, 0), 0, x)


@register(aten.threshold.default)
def threshold(x, threshold, value):
    return where(aten.le.Scalar(x, threshold), value, x)


@register(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return where(aten.le.Scalar(self, threshold), 0, grad_output)


@register(aten.gelu.default)
@opmath
def gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), math.sqrt(2 / math.pi))
        return mul(mul(x, 0.5), add(aten.tanh.default(inner), 1))
    return mul(mul(x, 0.5), add(aten.erf.default(mul(x, math.sqrt(0.5))), 1))


@register(aten.gelu_backward.default)
@opmath
def gelu_backward(grad, x, approximate="none"):
    if approximate == "tanh":
        k_beta = math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5
        k_kappa = 0.044715
        x_sq = mul(x, x)
        inner = mul(add(x, mul(mul(x_sq, x), k_kappa)), k_beta)
        t = aten.tanh.default(inner)
        left = mul(x, 0.5)
        right = add(t, 1)
        left_d = mul(right, 0.5)
        t_d = sub(1, mul(t, t))
        inner_d = mul(add(mul(x_sq, 3 * k_kappa), 1), k_beta)
        right_d = mul(mul(left, t_d), inner_d)
        return mul(grad, add(left_d, right_d))
    cdf = mul(add(aten.erf.default(mul(x, math.sqrt(0.5))), 1), 0.5)
    pdf = mul(aten.exp.default(mul(mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return mul(grad, add(cdf, mul(x, pdf)))


@register(aten.silu.default)
@opmath
def silu(x):
    return mul(x, aten.sigmoid.default(x))


@register(aten.silu_backward.default)
@opmath
def silu_backward(grad_output, x):
    s = aten.sigmoid.default(x)
    return mul(grad_output, mul(s, add(mul(x, sub(1, s)), 1)))


@register(aten.sigmoid_backward.default)
@opmath
def sigmoid_backward(grad_output, y):
    return mul(grad_output, mul(sub(1, y), y))


@register(aten.tanh_backward.default)
@opmath
def tanh_backward(grad_output, y):
    return mul(grad_output, sub(1, mul(y, y)))


@register(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return where(aten.lt.Scalar(x, min_val), min_val, where(aten.gt.Scalar(x, max_val), max_val, x))


@register(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, x, min_val, max_val):
    outside = aten.bitwise_or.Tensor(aten.le.Scalar(x, min_val), aten.ge.Scalar(x, max_val))
    return where(outside, 0, grad_output)


@register(aten.leaky_relu.default)
@opmath
def leaky_relu(x, negative_slope=0.01):
    return where(aten.gt.Scalar(x, 0), x, mul(x, negative_slope))


@register(aten.leaky_relu_backward.default)
@opmath
def leaky_relu_backward(grad_output, x, negative_slope, self_is_result):
    return where(aten.gt.Scalar(x, 0), grad_output, mul(grad_output, negative_slope))


@register(aten.elu.default)
@opmath
def elu(x, alpha=1, scale=1, input_scale=1):
    neg = mul(aten.expm1.default(mul(x, input_scale)), alpha * scale)
    return where(aten.gt.Scalar(x, 0), mul(x, scale), neg)


@register(aten.elu_backward.default)
@opmath
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    negcoef, poscoef, negiptcoef = alpha * scale, scale, input_scale
    if is_result:
        neg = mul(mul(grad_output, negiptcoef), add(self_or_result, negcoef))
    else:
        neg = mul(mul(grad_output, negiptcoef * negcoef),
                  aten.exp.default(mul(self_or_result, negiptcoef)))
    return where(aten.le.Scalar(self_or_result, 0), neg, mul(grad_output, poscoef))


_ONE_SIXTH_F32 = float(torch.tensor(1 / 6, dtype=torch.float32))


def _relu6_shifted(x):
    y = add(x, 3)
    return where(aten.lt.Scalar(y, 0), 0, where(aten.gt.Scalar(y, 6), 6, y))


@register(aten.hardswish.default)
@opmath
def hardswish(x):
    return div(mul(x, _relu6_shifted(x)), 6)


@register(aten.hardswish_backward.default)
@opmath
def hardswish_backward(grad_output, x):
    # ATen (2.14): 0 for x <= -3, the slope for -3 < x < 3, grad for x >= 3 (the kinks take the
    # outer piece, like hardsigmoid_backward)
    mid = mul(grad_output, add(div(x, 3), 0.5))
    return where(aten.le.Scalar(x, -3), 0, where(aten.lt.Scalar(x, 3), mid, grad_output))


@register(aten.hardsigmoid.default)
@opmath
def hardsigmoid(x):
    return div(_relu6_shifted(x), 6)


@register(aten.hardsigmoid_backward.default)
@opmath
def hardsigmoid_backward(grad_output, x):
    inside = aten.bitwise_and.Tensor(aten.gt.Scalar(x, -3), aten.lt.Scalar(x, 3))
    # ATen multiplies by a float (not double) 1/6 constant; match it bit for bit
    return where(inside, mul(grad_output, _ONE_SIXTH_F32), 0)


@register(aten.softplus.default)
@opmath
def softplus(x, beta=1, threshold=20):
    xb = mul(x, beta)
    return where(aten.gt.Scalar(xb, threshold), x, div(aten.log1p.default(aten.exp.default(xb)), beta))


@register(aten.softplus_backward.default)
@opmath
def softplus_backward(grad_output, x, beta, threshold):
    xb = mul(x, beta)
    z = aten.exp.default(xb)
    return where(aten.gt.Scalar(xb, threshold), grad_output, div(mul(grad_output, z), add(z, 1)))


@register(aten.mish.default)
@opmath
def mish(x):
    return mul(x, aten.tanh.default(softplus(x)))


@register(aten.mish_backward.default)
@opmath
def mish_backward(grad_output, x):
    s = aten.sigmoid.default(x)
    t = aten.tanh.default(softplus(x))
    return mul(grad_output, add(t, mul(mul(x, s), sub(1, mul(t, t)))))


@register(aten.log_sigmoid_forward.default)
@opmath
def log_sigmoid_forward(x):
    min_ = where(aten.lt.Scalar(x, 0), x, 0)
    z = aten.exp.default(aten.neg.default(aten.abs.default(x)))
    # the CPU kernel returns exp(-|x|) as its buffer; other devices an empty one
    buffer = z if on_cpu(x) else aten.full.default([0], 0, dtype=x.dtype, device=x.device)
    return sub(min_, aten.log1p.default(z)), buffer


@register(aten.log_sigmoid_backward.default)
@opmath
def log_sigmoid_backward(grad_output, x, buffer):
    in_neg = aten.lt.Scalar(x, 0)
    one = scalar(1, x)
    max_deriv = where(in_neg, one, 0)
    sign = where(in_neg, one, -1)
    z = aten.exp.default(aten.neg.default(aten.abs.default(x)))
    return mul(grad_output, sub(max_deriv, mul(sign, div(z, add(z, 1)))))


@register(aten.glu.default)
@opmath
def glu(x, dim=-1):
    a, b = aten.split.Tensor(x, x.shape[dim] // 2, dim)
    return mul(a, aten.sigmoid.default(b))


@register(aten.glu_backward.default)
@opmath
def glu_backward(grad_output, x, dim):
    a, b = aten.split.Tensor(x, x.shape[dim] // 2, dim)
    gb = aten.sigmoid.default(b)
    ga = mul(grad_output, gb)
    gbd = mul(mul(mul(sub(1, gb), gb), grad_output), a)
    return aten.cat.default([ga, gbd], dim)


@register(aten._prelu_kernel.default)
def prelu_kernel(x, weight):
    return where(aten.gt.Scalar(x, 0), x, mul(weight, x))


@register(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, x, weight):
    pos = aten.gt.Scalar(x, 0)
    return where(pos, grad_output, mul(weight, grad_output)), where(pos, 0, mul(x, grad_output))


@register(aten.logit.default)
@opmath
def logit(x, eps=None):
    if eps is not None:
        x = where(aten.lt.Scalar(x, eps), eps, where(aten.gt.Scalar(x, 1 - eps), 1 - eps, x))
    return aten.log.default(div(x, sub(1, x)))


@register(aten.logit_backward.default)
@opmath
def logit_backward(grad_output, x, eps=None):
    g = div(grad_output, mul(x, sub(1, x)))
    if eps is None:
        nan = scalar(float("nan"), g)
        return where(aten.bitwise_or.Tensor(aten.lt.Scalar(x, 0), aten.gt.Scalar(x, 1)), nan, g)
    outside = aten.bitwise_or.Tensor(aten.lt.Scalar(x, eps), aten.gt.Scalar(x, 1 - eps))
    return where(outside, 0, g)
