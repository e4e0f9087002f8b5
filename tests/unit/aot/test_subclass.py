"""Tensor subclasses (capture/subclasses.py, aot/subclass.py): a compiled function or module
whose inputs or parameters follow the __torch_dispatch__ + __tensor_flatten__ protocol is traced
through to the aten ops the subclass runs, in one graph, equal to eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

import ember
from ember import capture

aten = torch.ops.aten


class TwoTensor(torch.Tensor):
    """Holds two tensors of one shape; every op runs on both."""

    @staticmethod
    def __new__(cls, a, b):
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, strides=a.stride(), dtype=a.dtype,
                                                   device=a.device, requires_grad=False)

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __tensor_flatten__(self):
        return ["a", "b"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return TwoTensor(inner["a"], inner["b"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        pick = lambda k: lambda x: getattr(x, k) if isinstance(x, TwoTensor) else x   # noqa: E731
        a = func(*tree_map(pick("a"), args), **tree_map(pick("a"), kwargs))
        b = func(*tree_map(pick("b"), args), **tree_map(pick("b"), kwargs))
        if isinstance(a, torch.Tensor) and a.shape == b.shape and func.is_view is False:
            return TwoTensor(a, b)
        return a


class Int8Weight(torch.Tensor):
    """Weight-only int8: q (int8, per row) * scale; linear dequantizes and runs mm."""

    @staticmethod
    def __new__(cls, q, scale, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=dtype, device=q.device)

    def __init__(self, q, scale, dtype):
        self.q, self.scale, self.out_dtype = q, scale, dtype

    @staticmethod
    def quantize(w):
        scale = w.abs().amax(1, keepdim=True) / 127
        return Int8Weight((w / scale).round().to(torch.int8), scale, w.dtype)

    def dequantize(self):
        return self.q.to(self.out_dtype) * self.scale

    def __tensor_flatten__(self):
        return ["q", "scale"], {"dtype": self.out_dtype}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Int8Weight(inner["q"], inner["scale"], ctx["dtype"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):
            return Int8Weight(args[0].q, args[0].scale, args[0].out_dtype)
        unwrap = lambda x: x.dequantize() if isinstance(x, Int8Weight) else x   # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))



def f(x, y):
    return (x * 2 + y).sin()


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_two_tensor_inputs_one_graph(backend):
    a, b, y = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    x = TwoTensor(a, b)
    cf = ember.compile(f, backend=backend, fullgraph=True)
    got = cf(x, y)
    assert type(got) is TwoTensor
    torch.testing.assert_close(got.a, f(a, y))
    torch.testing.assert_close(got.b, f(b, y))
    assert capture.stats()["graphs"] == 1


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def quantize(m):
    for lin in (m.l1, m.l2):
        lin.weight = nn.Parameter(Int8Weight.quantize(lin.weight.detach()), requires_grad=False)
    return m


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_int8_weight_only_mlp(backend):
    torch.manual_seed(0)
    m = quantize(MLP())
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = m(x)
        ember.compile(m, backend=backend, fullgraph=True)
        torch.testing.assert_close(m(x), want)
    assert capture.stats()["graphs"] == 1
