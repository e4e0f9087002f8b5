"""Layouts at the aot boundary in training (docs/design/086-tangent-layouts.md): a tangent in
another dense layout than the traced one is taken by a backward compiled for it (no ATen copy
first), and an input gradient comes back in its input's memory format (no AccumulateGrad copy).
Every case checks values and gradients against eager and the gradients' strides."""
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember import counters
from ember.aot import runtime

TOL = dict(rtol=1e-4, atol=1e-5)


def _counts():
    return dict(counters.snapshot()["counts"])


def _delta(before, name):
    return _counts().get(name, 0) - before.get(name, 0)


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of NCHW through permutes (ConvNeXt, gcvit, EfficientFormer)."""

    def __init__(self, c):
        super().__init__()
        self.ln = nn.LayerNorm(c)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _step(fn, m, x, g):
    """(output, x.grad, the gradient autograd handed to x's AccumulateGrad, parameter grads)."""
    x = x.detach().clone().requires_grad_()
    seen = []
    x.register_hook(lambda gr: seen.append((tuple(gr.stride()), gr.data_ptr())))
    for p in m.parameters():
        p.grad = None
    out = fn(x)
    out.backward(g)
    return out.detach(), x.grad, seen[-1], [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("shape", [(2, 16, 7, 9), (2, 32, 8, 8)])
def test_layernorm2d_has_no_layout_copies(shape):
    torch.manual_seed(0)
    m = LayerNorm2d(shape[1])
    with torch.no_grad():
        m.ln.weight.uniform_(0.5, 1.5)
        m.ln.bias.uniform_(-0.5, 0.5)
    x, g = torch.randn(shape), torch.randn(shape)          # both NCHW contiguous
    ref, ref_grad, _, ref_pgrads = _step(m, m, x, g)
    cm = ember.compile(copy.deepcopy(m))                   # a module compiles in place
    before = _counts()
    for _ in range(2):
        out, grad, (hook_stride, hook_ptr), pgrads = _step(cm, cm, x, g)
        torch.testing.assert_close(out, ref, **TOL)
        torch.testing.assert_close(grad, ref_grad, **TOL)
        for a, b in zip(pgrads, ref_pgrads):
            torch.testing.assert_close(a, b, **TOL)
        assert grad.stride() == ref_grad.stride() == x.stride()
        # the backward returned dx in x's layout: AccumulateGrad kept it (no clone)
        assert hook_stride == x.stride() and hook_ptr == grad.data_ptr()
    # the tangent (g seen through the permute: NCHW order of the NHWC-stored output) was read
    # in place by a backward compiled for its layout, once
    assert _delta(before, "tangent_copies") == 0
    assert _delta(before, "tangent_layout_backwards") == 1
    assert _delta(before, "grad_layout_stores") == 1           # dx, traced NHWC


def test_tangent_layouts_each_get_their_backward():
    torch.manual_seed(1)
    m = LayerNorm2d(24)
    x = torch.randn(2, 24, 6, 10)
    cm = ember.compile(copy.deepcopy(m))
    before = _counts()
    tangents = [torch.randn(2, 24, 6, 10),                                        # NCHW
                torch.randn(2, 24, 6, 10).to(memory_format=torch.channels_last),  # traced layout
                torch.randn(2, 24, 6, 10).permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2),
                torch.randn(2, 24, 6, 10)]                                        # NCHW again
    for g in tangents:
        ref, ref_grad, _, ref_pgrads = _step(m, m, x, g)
        out, grad, _, pgrads = _step(cm, cm, x, g)
        torch.testing.assert_close(out, ref, **TOL)
        torch.testing.assert_close(grad, ref_grad, **TOL)
        for a, b in zip(pgrads, ref_pgrads):
            torch.testing.assert_close(a, b, **TOL)
        assert grad.stride() == ref_grad.stride()
    assert _delta(before, "tangent_layout_backwards") == 2     # NCHW and NCWH, not the traced one
    assert _delta(before, "tangent_copies") == 0


def test_expanded_tangent_and_too_many_layouts_are_copied(monkeypatch):
    monkeypatch.setattr(runtime, "MAX_TANGENT_LAYOUTS", 1)
    torch.manual_seed(2)
    m = LayerNorm2d(16)
    x = torch.randn(2, 16, 5, 6)
    cm = ember.compile(copy.deepcopy(m))
    before = _counts()
    tangents = [torch.randn(2, 16, 5, 6),                                  # a variant
                torch.randn(2, 16, 5, 6).permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2),
                torch.randn(1, 1, 1, 1).expand(2, 16, 5, 6)]               # not dense
    for g in tangents:
        ref, ref_grad, _, ref_pgrads = _step(m, m, x, g)
        out, grad, _, pgrads = _step(cm, cm, x, g)
        torch.testing.assert_close(grad, ref_grad, **TOL)
        for a, b in zip(pgrads, ref_pgrads):
            torch.testing.assert_close(a, b, **TOL)
    assert _delta(before, "tangent_layout_backwards") == 1
    assert _delta(before, "tangent_copies") == 2


def test_tangent_layout_a_view_cannot_take_is_copied():
    """The backward views the tangent (the gradient of a view): a transposed tangent cannot be
    viewed so; the re-trace refuses and the tangent is copied to the traced layout."""
    def f(x):
        return (x * 2).view(4, 6).exp()

    x = torch.randn(24)
    cm = ember.compile(f)
    before = _counts()
    g = torch.randn(6, 4).t()                   # [4, 6], strides (1, 4): dense, transposed
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xe).backward(g)
    cm(xc).backward(g)
    torch.testing.assert_close(xc.grad, xe.grad, **TOL)
    assert _delta(before, "tangent_layout_backwards") + _delta(before, "tangent_copies") == 1


def test_input_gradient_takes_its_inputs_memory_format():
    """A channels-last leaf whose gradient the graph computes contiguous: eager's AccumulateGrad
    copies it to channels-last; ember's backward writes it channels-last."""
    def f(x, w):
        return (x.contiguous() * w).sin()

    torch.manual_seed(3)
    x = torch.randn(2, 8, 5, 7).to(memory_format=torch.channels_last)
    w = torch.randn(8, 1, 1)
    g = torch.randn(2, 8, 5, 7)
    cm = ember.compile(f)
    grads, strides = [], []
    for fn in (f, cm):
        xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        seen = []
        xl.register_hook(lambda gr: seen.append(gr.stride()))
        fn(xl, wl).backward(g)
        grads.append((xl.grad, wl.grad))
        strides.append((xl.grad.stride(), seen[-1]))
    torch.testing.assert_close(grads[1][0], grads[0][0], **TOL)
    torch.testing.assert_close(grads[1][1], grads[0][1], **TOL)
    assert strides[1][0] == strides[0][0] == x.stride()
    assert strides[1][1] == x.stride()          # eager hands AccumulateGrad a contiguous one
    assert strides[0][1] != x.stride()


def test_tangent_disagreeing_with_saved_activations_is_copied():
    """A contiguous gradient of a channels-last BatchNorm: read in place, it would put every
    backward kernel between two layouts (the saved channels-last input); it is copied once."""
    torch.manual_seed(4)
    m = nn.BatchNorm2d(8)
    cm = ember.compile(copy.deepcopy(m))
    x = torch.randn(2, 8, 6, 5).to(memory_format=torch.channels_last)
    g = torch.randn(2, 8, 6, 5)
    before = _counts()
    ref, ref_grad, _, ref_pgrads = _step(m, m, x, g)
    out, grad, (hook_stride, _), pgrads = _step(cm, cm, x, g)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)
    for a, b in zip(pgrads, ref_pgrads):
        torch.testing.assert_close(a, b, **TOL)
    assert grad.stride() == ref_grad.stride() == hook_stride == x.stride()
    assert _delta(before, "tangent_layout_backwards") == 0
    assert _delta(before, "tangent_copies") == 1


def test_mixed_layouts_counts_layout_converting_ops():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    a.meta["val"] = torch.empty(2, 3, 4, 5, device="meta")
    b.meta["val"] = torch.empty(2, 3, 4, 5, device="meta").to(memory_format=torch.channels_last)
    s = g.call_function(torch.ops.aten.add.Tensor, (a, b))
    s.meta["val"] = torch.empty(2, 3, 4, 5, device="meta")              # b read across layouts
    t = g.call_function(torch.ops.aten.mul.Tensor, (a, a))
    t.meta["val"] = torch.empty(2, 3, 4, 5, device="meta")              # one layout
    p = g.call_function(torch.ops.aten.permute.default, (b, [0, 2, 3, 1]))
    p.meta["val"] = b.meta["val"].permute(0, 2, 3, 1)                    # a view: no kernel
    g.output((s, t, p))
    assert runtime.mixed_layouts(g) == 1
