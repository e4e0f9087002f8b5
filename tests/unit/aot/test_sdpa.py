"""CPU attention takes eager's fused (flash) kernel when eager would, forward and backward."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot import trace_aten

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _masks():
    torch.manual_seed(0)
    return {
        "none": None,
        "float": torch.randn(2, 1, 16, 16),
        "bool": torch.rand(2, 1, 16, 16) > 0.3,
    }


@pytest.mark.parametrize("mask", ["none", "float", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_eager_and_uses_fused_kernel(mask, causal):
    m = _masks()[mask]
    if causal and m is not None:
        pytest.skip("sdpa takes either a mask or is_causal")
    torch.manual_seed(1)
    q, k, v = [torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3)]

    def f(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, attn_mask=m, is_causal=causal) * 2

    gm = trace_aten(f, (q, k, v))
    assert any(n.target is FLASH for n in gm.graph.nodes), gm.code
    compiled = ember.compile(f, backend="ember", fullgraph=True)
    got, want = compiled(q, k, v), f(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    gg = torch.autograd.grad(got.sum(), [q, k, v])
    gw = torch.autograd.grad(want.sum(), [q, k, v])
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_sdpa_with_dropout_is_left_to_decompose():
    q = torch.randn(1, 2, 8, 4)
    gm = trace_aten(lambda a: F.scaled_dot_product_attention(a, a, a, dropout_p=0.5), (q,))
    assert not any(n.target is FLASH for n in gm.graph.nodes)


def _check_values_and_grads(f, inputs, tol=1e-6):
    compiled = ember.compile(f, backend="ember", fullgraph=True)
    got, want = compiled(*inputs), f(*inputs)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    grad_out = torch.randn_like(want)
    gg = torch.autograd.grad(got, inputs, grad_out)
    gw = torch.autograd.grad(want, inputs, grad_out)
    for a, b in zip(gg, gw):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("mask", ["none", "float", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_takes_the_fused_kernel_unrepeated(mask, causal):
    """enable_gqa (8 query heads, 2 key/value heads): eager runs the fused kernel with key and
    value as given; so does ember (it ran bmm + softmax before), gradients of k/v's own shape."""
    m = _masks()[mask]
    if causal and m is not None:
        pytest.skip("sdpa takes either a mask or is_causal")
    torch.manual_seed(2)
    q = torch.randn(2, 8, 16, 8, requires_grad=True)
    k, v = [torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(2)]

    def f(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, attn_mask=m, is_causal=causal,
                                              enable_gqa=True) * 2

    gm = trace_aten(f, (q, k, v))
    flash = [n for n in gm.graph.nodes if n.target is FLASH]
    assert len(flash) == 1, gm.code
    assert tuple(flash[0].args[1].meta["val"].shape) == (2, 2, 16, 8)      # k not repeated
    assert not any(n.target in (torch.ops.aten.bmm.default, torch.ops.aten.expand.default)
                   for n in gm.graph.nodes), gm.code
    _check_values_and_grads(f, (q, k, v))


def test_a_boolean_mask_shared_by_layers_is_converted_once():
    """A decoder hands one boolean mask to every layer: one float mask serves all the fused
    calls (it was converted, and stored, once per call, forward and backward)."""
    torch.manual_seed(3)
    m = torch.rand(2, 1, 16, 16) > 0.3
    m[..., 0] = True                                   # no fully masked row
    xs = [torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3)]

    def f(x0, x1, x2):
        h = x0
        for w in (x1, x2, x1):
            h = F.scaled_dot_product_attention(h, w, w, attn_mask=m) + h
        return h

    gm = trace_aten(f, xs)
    assert sum(n.target is FLASH for n in gm.graph.nodes) == 3
    conversions = [n for n in gm.graph.nodes
                   if n.target in (torch.ops.aten.masked_fill.Scalar, torch.ops.aten.where.self)
                   and tuple(n.meta["val"].shape) == (2, 1, 16, 16)]
    assert len(conversions) == 1, gm.code
    _check_values_and_grads(f, xs, tol=1e-5)


def test_a_boolean_mask_changed_in_place_between_calls_is_converted_again():
    torch.manual_seed(4)
    xs = [torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(2)]

    def f(x0, x1):
        m = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril()
        h = F.scaled_dot_product_attention(x0, x1, x1, attn_mask=m)
        m[..., :4] = False
        m[..., 0] = True                               # no fully masked row
        return F.scaled_dot_product_attention(h, x1, x1, attn_mask=m) + h

    _check_values_and_grads(f, xs, tol=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_in_training_takes_the_fused_kernel(batch_first):
    """nn.MultiheadAttention in training runs F.multi_head_attention_forward, a Python function
    kept as one graph call: the sdpa inside its body takes the fused kernel as eager's does
    (it traced as bmm, softmax, bmm: torchvision's ViT trained 0.97x eager), forward and
    backward, with eager's values and gradients."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first)
    x = torch.randn(2, 12, 32) if batch_first else torch.randn(12, 2, 32)

    def f(x):
        return mha(x, x, x, need_weights=False)[0]

    gm = trace_aten(f, (x,))
    assert sum(n.target is FLASH for n in gm.graph.nodes) == 1, gm.code
    compiled = ember.compile(f, backend="ember", fullgraph=True)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    got, want = compiled(xs[0]), f(xs[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, [xs[0], *mha.parameters()], grad_out)
    want_grads = torch.autograd.grad(want, [xs[1], *mha.parameters()], grad_out)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
