"""A one-element tensor passed where an op takes a number (optimizers' tensor hyper-parameters):
written with the tensor as an operand, against eager, in one graph."""
from __future__ import annotations

import torch

from .helpers import check


def test_addcmul_addcdiv_with_tensor_value():
    def f(x, y, z, s):
        x.addcmul_(y, z, value=s)
        return x.addcdiv_(y, z + 2, value=-s)

    check(f, torch.ones(2, 2), torch.ones(2, 2) + 1, torch.rand(2, 2), torch.tensor(0.3))


def test_foreach_lerp_with_tensor_weight():
    def f(xs, ys, w):
        return torch._foreach_lerp_(xs, ys, w)

    check(f, [torch.ones(2, 2) * 4.26, torch.ones(3) * 3.14], [torch.ones(2, 2), torch.zeros(3)],
          torch.tensor(0.7))


def test_foreach_pow_with_tensor_base():
    def f(s, es):
        return torch._foreach_pow(s, es)

    check(f, torch.tensor(0.8), [torch.tensor(3.4), torch.tensor([7.8, 1.0])])


def test_adam_with_tensor_lr_and_betas_one_graph():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    for p in params:
        p.grad = torch.randn_like(p)

    def step(ps, grads, m, v, lr, b1, b2):
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        for p, g, mi, vi in zip(ps, grads, m, v):
            vi.addcmul_(g, g, value=1 - b2)
            p.addcdiv_(mi, vi.sqrt() + 1e-8, value=-lr)
        return ps

    args = ([p.detach().clone() for p in params], [p.grad.clone() for p in params],
            [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
            torch.tensor(0.01), torch.tensor(0.9), torch.tensor(0.999))
    check(step, *args)
