"""Capture, a one-element tensor where an op takes a Python number (a `Scalar` argument).

Eagerly torch reads such a tensor's value (`.item()`) before the op runs: optimizers with
tensor hyper-parameters do this (`exp_avg.lerp_(grad, 1 - beta1)` with a tensor beta,
`addcmul_(.., value=-lr)` with a tensor lr). The trace cannot read the value, so each op is
written with the tensor as a tensor operand, as Dynamo's decompositions write them:

  x.addcmul_(a, b, value=t)            x.add_(a * b * t)
  x.addcdiv_(a, b, value=t)            x.add_(a / b * t)
  torch._foreach_lerp_(xs, ys, t)      x.lerp_(y, t) for each pair (lerp's tensor-weight kernel)
  torch._foreach_pow(t, exps)          torch.pow(t, e) for each exponent

`REWRITES[op](tracer, args, kwargs) -> value | None` (None: no tensor in the scalar slot).
"""
from __future__ import annotations

import operator

import torch

from .values import ListV, TensorV, TupleV


def _scalar_tensor(v) -> bool:
    return isinstance(v, TensorV) and v.meta.numel() == 1


def _addc(combine):
    def rewrite(tr, args, kwargs):
        if len(args) != 3 or set(kwargs) != {"value"} or not _scalar_tensor(kwargs["value"]):
            return None
        x, a, b = args
        term = tr.call_graph(torch.mul, [tr.call_graph(combine, [a, b], {}), kwargs["value"]], {})
        return tr.call_graph(torch.Tensor.add_, [x, term], {})
    return rewrite


def _foreach_lerp_(tr, args, kwargs):
    if len(args) != 3 or kwargs or not _scalar_tensor(args[2]):
        return None
    xs, ys = tr.iterate(args[0]), tr.iterate(args[1])
    if len(xs) != len(ys):
        return None
    for x, y in zip(xs, ys):
        tr.call_graph(torch.Tensor.lerp_, [x, y, args[2]], {})
    return args[0]                  # the list itself, as eager returns it


def _foreach_pow(tr, args, kwargs):
    if len(args) != 2 or kwargs or not _scalar_tensor(args[0]) or \
            not isinstance(args[1], (ListV, TupleV)):
        return None
    return TupleV([tr.call_graph(torch.pow, [args[0], e], {}) for e in tr.iterate(args[1])])


REWRITES = {torch.Tensor.addcmul_: _addc(operator.mul), torch.Tensor.addcdiv_: _addc(operator.truediv),
            torch._foreach_lerp_: _foreach_lerp_, torch._foreach_pow: _foreach_pow}
