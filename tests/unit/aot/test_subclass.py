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
    """Weight-only int8: (q - zero) * scale per row; any op but detach dequantizes first. The
    zero point lives in the flatten context (so a different one must recompile)."""

    @staticmethod
    def __new__(cls, q, scale, dtype, zero=0):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=dtype, device=q.device)

    def __init__(self, q, scale, dtype, zero=0):
        self.q, self.scale, self.out_dtype, self.zero = q, scale, dtype, zero

    @staticmethod
    def quantize(w, zero=0):
        scale = w.abs().amax(1, keepdim=True) / 100
        return Int8Weight((w / scale).round().to(torch.int8) + zero, scale, w.dtype, zero)

    def dequantize(self):
        return (self.q.to(self.out_dtype) - self.zero) * self.scale

    def __tensor_flatten__(self):
        return ["q", "scale"], {"dtype": self.out_dtype, "zero": self.zero}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Int8Weight(inner["q"], inner["scale"], ctx["dtype"], ctx["zero"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):
            w = args[0]
            return Int8Weight(w.q, w.scale, w.out_dtype, w.zero)
        unwrap = lambda x: x.dequantize() if isinstance(x, Int8Weight) else x   # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))


def dynamo_graphs(fn, *args) -> int:
    """torch.compile's graph count for the same call (the peer)."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    cnt = CompileCounter()
    torch.compile(fn, backend=cnt)(*args)
    return cnt.frame_count


def f(x, y):
    return (x * 2 + y).sin()


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_two_tensor_inputs_one_graph(backend):
    # torch.compile: 1 graph, 0 breaks for this call, and for each case below
    # (measured: benchmarks/issue28_subfunc.py)
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


def test_flatten_context_and_inner_tensors_are_guarded():
    w = torch.randn(6, 4)
    x = torch.randn(3, 4)
    cf = ember.compile(lambda x, w: torch.nn.functional.linear(x, w).relu(), backend="aot_eager",
                       fullgraph=True)
    for zero in (0, 3, 0):          # the zero point is flatten context: a second entry
        q = Int8Weight.quantize(w, zero)
        torch.testing.assert_close(cf(x, q), (x @ q.dequantize().t()).relu())
    st = capture.stats()
    assert st["graphs"] == 2 and st["recompiles"] == 1, st
    # an inner tensor's layout changes (scale transposed-strided): a guard on the inner tensor
    q = Int8Weight.quantize(w)
    q.scale = q.scale.reshape(1, 6).clone().t()
    assert q.scale.stride() == (1, 6)
    torch.testing.assert_close(cf(x, q), (x @ q.dequantize().t()).relu())
    a, b = torch.randn(4, 5), torch.randn(5, 4).t()
    g = ember.compile(f, backend="aot_eager")
    for bb in (b.contiguous(), b):      # b's strides differ: recompiles, values still right
        got = g(TwoTensor(a, bb), a)
        torch.testing.assert_close(got.b, f(bb, a))
    assert capture.stats()["recompiles"] == 3


def test_quantized_mlp_training_grads_through_plain_inputs():
    # the frozen quantized weights are subclass inputs; biases and x get grads, equal to eager
    torch.manual_seed(0)
    m = quantize(MLP())
    torch.manual_seed(0)        # (load_state_dict cannot copy into Int8Weight: same seed)
    ref = quantize(MLP())
    ember.compile(m, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 16, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    for _ in range(2):
        m(x).pow(2).sum().backward()
        ref(xr).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    for name in ("l1.bias", "l2.bias"):
        torch.testing.assert_close(m.get_parameter(name).grad, ref.get_parameter(name).grad)
    assert m.l1.weight.grad is None
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st


def test_subclass_output_whose_gradient_is_plain_raises_naming_the_class():
    # the traced backward assumed the output's gradient is a TwoTensor (as torch.compile
    # assumes a subclass tangent); `.sum().backward()` hands it a plain tensor: it raises,
    # naming the class, never a wrong gradient
    a, b, y = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    x = TwoTensor(a, b).requires_grad_(True)
    out = ember.compile(f, backend="aot_eager", fullgraph=True)(x, y)
    torch.testing.assert_close(out.a, f(a, y))
    with pytest.raises(ember.EmberError, match="gradient of a TwoTensor is a Tensor"):
        out.sum().backward()
    assert x.grad is None


@pytest.mark.parametrize("config", ["Int8WeightOnlyConfig",
                                    "Int8DynamicActivationInt8WeightConfig"])
def test_torchao_int8_mlp(config):
    ao = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    ao.quantize_(m, getattr(ao, config)())
    assert type(m[0].weight).__name__ == "Int8Tensor"
    x = torch.randn(8, 64)
    with torch.no_grad():
        want = m(x)
        peer = dynamo_graphs(m, x)       # 1 (measured: torch.compile keeps it in one graph)
        ember.compile(m, backend="ember", fullgraph=True)
        torch.testing.assert_close(m(x), want)
        torch.testing.assert_close(m(x * 2), m.forward(x * 2))
    st = capture.stats()
    assert st["graphs"] == peer == 1 and st.get("graph_breaks", 0) == 0, st


def test_subclass_parameter_training_grads_equal_eager():
    # torch's own TwoTensor (gradients are TwoTensors): a subclass parameter that requires grad;
    # its gradient comes back as a TwoTensor equal to eager's, in one graph
    from torch.testing._internal.two_tensor import TwoTensor as TT

    def g(x, y):
        return ((x * 2).sin() * y).sum()
    for backend in ("aot_eager", "ember"):
        ember.reset()
        a, b, y = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
        xa, xb = TT(a, b).requires_grad_(True), TT(a.clone(), b.clone()).requires_grad_(True)
        out = ember.compile(g, backend=backend, fullgraph=True)(xa, y)
        want = g(xb, y)
        assert type(out) is type(want) is TT
        torch.testing.assert_close(out.a, want.a)
        out.backward()
        want.backward()
        assert type(xa.grad) is TT
        torch.testing.assert_close(xa.grad.a, xb.grad.a)
        torch.testing.assert_close(xa.grad.b, xb.grad.b)
        st = capture.stats()
        assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st
    # y requiring grad too: its gradient would be a TwoTensor (a subclass gradient of a plain
    # input), refused loudly
    with pytest.raises(ember.EmberError, match="gradient of a plain input is a TwoTensor"):
        ember.compile(g, backend="aot_eager")(TT(a, b).requires_grad_(True),
                                              y.clone().requires_grad_(True))


def test_module_with_subclass_parameter_sgd_steps_equal_eager():
    from torch.testing._internal.two_tensor import TwoTensor as TT

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(TT(torch.randn(5, 3), torch.randn(5, 3)))

        def forward(self, x):
            return (x @ self.w).tanh().sum()
    torch.manual_seed(0)
    m, ref = Net(), Net()
    with torch.no_grad():
        ref.w.a.copy_(m.w.a)
        ref.w.b.copy_(m.w.b)
    ember.compile(m, backend="ember", fullgraph=True)
    x = torch.randn(4, 5)
    for net in (m, ref):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            net(x).backward()
            opt.step()
    torch.testing.assert_close(m.w.a, ref.w.a)
    torch.testing.assert_close(m.w.b, ref.w.b)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0, st


def branch_on_type(x):
    y = x * 2
    if isinstance(y, TwoTensor):        # a subclass result: the trace sees its class
        return y + 1, x.a.sum() + y.b   # an input's inner tensor (its source), a result's
    return y - 1, x.b.sum()


def test_isinstance_of_subclass_results_and_inner_attribute_reads():
    a, b = torch.randn(3), torch.randn(3)
    got = ember.compile(branch_on_type, backend="aot_eager", fullgraph=True)(TwoTensor(a, b))
    want = branch_on_type(TwoTensor(a, b))
    assert type(got[0]) is type(want[0]) is TwoTensor
    torch.testing.assert_close(got[0].b, want[0].b)
    torch.testing.assert_close(got[1], want[1])
