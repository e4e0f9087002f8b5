"""Inference sdpa on ember's own fused CPU kernel (ember/backends/sdpa_kernel.py,
ember/codegen/sdpa_cpp.py).

Values vs eager `F.scaled_dot_product_attention` (ATen's flash kernel) at rtol 1e-5 of the
output's largest magnitude (float32; the kernel sums in another order): masks of every broadcast
form, Lq != Lk, lengths that are not multiples of the kernel's tiles, strided inputs, rows masked
wholly. Routing: which calls run the kernel (profiler events of `ember::sdpa_infer`), per the
shape rule, grad and options.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.backends.sdpa_kernel import kernel_wins

sdpa_infer = torch.ops.ember.sdpa_infer


def close(got, ref):
    scale = ref.abs().max().clamp_min(1e-6)
    assert got.shape == ref.shape
    assert ((got - ref).abs().max() / scale).item() < 1e-5


def heads(b, n, h, d, g):
    return torch.randn(b, n, h, d, generator=g).transpose(1, 2)      # as a transformer's heads


def make_mask(kind, b, h, lq, lk, g):
    if kind == "none":
        return None
    if kind == "bias":                      # swin: relative-position bias + shift mask per window
        return torch.randn(b, h, lq, lk, generator=g)
    if kind == "causal2d":
        return torch.full((lq, lk), float("-inf")).triu(1)
    if kind == "pad":
        m = torch.zeros(b, 1, 1, lk)
        m[0, ..., lk // 2:] = float("-inf")
        return m
    if kind == "heads3d":
        return torch.randn(h, lq, lk, generator=g)
    if kind == "expanded":                  # stride 0 over batch and heads
        return torch.randn(1, 1, lq, lk, generator=g).expand(b, h, lq, lk)
    raise ValueError(kind)


@pytest.mark.parametrize("mask", ["none", "bias", "causal2d", "pad", "heads3d", "expanded"])
@pytest.mark.parametrize("b,h,lq,lk,d,dv", [
    (3, 2, 49, 49, 32, 32),       # swin window: 12-row tiles, a 1-row tail, 49 keys of 64
    (2, 3, 50, 77, 64, 64),       # Lq != Lk, 6-row tiles with a 2-row tail
    (1, 2, 61, 33, 16, 48),       # head dims 16 and 48, keys past one 32-column tile
    (1, 1, 100, 300, 64, 32),     # several 16x16 key transposes plus a scalar tail
])
def test_values_vs_eager(b, h, lq, lk, d, dv, mask):
    g = torch.Generator().manual_seed(lq * lk)
    q, k, v = heads(b, lq, h, d, g), heads(b, lk, h, d, g), heads(b, lk, h, dv, g)
    m = make_mask(mask, b, h, lq, lk, g)
    scale = 0.3
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)
    got = sdpa_infer(q, k, v, m, scale)
    close(got, ref)
    assert got.transpose(1, 2).is_contiguous()   # flash's [B, Lq, H, Dv] layout


@pytest.mark.parametrize("lq,lk", [(61, 61), (50, 77), (90, 40)])
def test_causal_vs_eager(lq, lk):
    g = torch.Generator().manual_seed(lq + lk)
    q, k, v = heads(2, lq, 3, 32, g), heads(2, lk, 3, 32, g), heads(2, lk, 3, 32, g)
    close(sdpa_infer(q, k, v, None, 0.2, True),
          F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2))


def test_contiguous_inputs_and_a_row_masked_wholly():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 52, 32, generator=g) for _ in range(3))
    m = torch.randn(2, 4, 52, 52, generator=g)
    m[1, 2, 7] = float("-inf")              # eager's fused kernel gives 0 for that row
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    got = sdpa_infer(q, k, v, m, 32 ** -0.5)
    close(got, ref)
    assert got[1, 2, 7].abs().max() == 0 and torch.isfinite(got).all()


def test_rule_on_shapes():
    assert kernel_wins(768, 49, 49, 32, 32) and kernel_wins(24, 197, 197, 64, 64)
    assert kernel_wins(6, 1500, 1500, 64, 64) and kernel_wins(6, 64, 1500, 64, 64)
    assert not kernel_wins(16, 32, 256, 64, 64)      # few queries: flash (measured 1.00x)
    assert not kernel_wins(8, 256, 256, 128, 128)    # head dim 128: flash (0.87x)
    assert not kernel_wins(8, 4096, 4096, 64, 64)    # keys past L2: flash (0.87x)
    assert not kernel_wins(16, 256, 256, 40, 40)     # head dim not a multiple of 16
    assert not kernel_wins(2, 64, 64, 32, 32)        # little work: the call's cost shows


class Attn(nn.Module):
    def __init__(self, d=32, h=2, causal=False, dropout=0.0):
        super().__init__()
        self.h, self.causal, self.dropout = h, causal, dropout
        self.qkv, self.out = nn.Linear(d * h, 3 * d * h), nn.Linear(d * h, d * h)

    def forward(self, x, mask=None):
        b, n, e = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, e // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                           dropout_p=self.dropout)
        return self.out(y.transpose(1, 2).reshape(b, n, e))


def kernel_calls(fn):
    """fn's output and how often its second call ran the kernel (the first compiles)."""
    fn()
    with torch.profiler.profile() as prof:
        out = fn()
    return out, sum(e.name == "ember::sdpa_infer" for e in prof.events())


@pytest.mark.parametrize("b,n,d,mask,expect", [
    (32, 49, 32, True, 1),      # swin-like windows with a bias: the kernel
    (8, 64, 64, False, 1),
    (32, 24, 32, False, 0),     # few queries: flash
    (8, 64, 128, False, 0),     # head dim 128: flash
    (2, 64, 64, False, 0),      # little work: flash
])
def test_compiled_model_routes_by_rule(b, n, d, mask, expect):
    torch.manual_seed(0)
    m = Attn(d=d).eval()
    x = torch.randn(b, n, 2 * d)
    mk = torch.randn(b, 2, n, n) if mask else None
    with torch.no_grad():
        ref = m(x, mk)
        c = ember.compile(Attn(d=d).eval())
        c.load_state_dict(m.state_dict())
        got, calls = kernel_calls(lambda: c(x, mk))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert calls == expect


def test_compiled_causal_takes_the_kernel():
    torch.manual_seed(0)
    m = Attn(causal=True).eval()
    x = torch.randn(16, 64, 64)       # enough work for the rule
    c = ember.compile(Attn(causal=True).eval())
    c.load_state_dict(m.state_dict())
    with torch.no_grad():
        got, calls = kernel_calls(lambda: c(x))
        torch.testing.assert_close(got, m(x), atol=1e-5, rtol=1e-5)
    assert calls == 1


@pytest.mark.parametrize("what", ["grad", "dropout_train", "option"])
def test_not_taken(what):
    torch.manual_seed(0)
    m = Attn(dropout=0.5 if what == "dropout_train" else 0.0)
    m.train(what == "dropout_train")
    x = torch.randn(16, 64, 64)       # enough work for the rule
    opts = {"attention": "as_written"} if what == "option" else {}
    c = ember.compile(m, options=opts)
    if what == "grad":                  # inputs that need gradients keep ATen's kernel
        xg = x.clone().requires_grad_()
        got, calls = kernel_calls(lambda: c(xg))
        xg.grad = None
        got.sum().backward()
        ref = x.clone().requires_grad_()
        m(ref).sum().backward()
        torch.testing.assert_close(xg.grad, ref.grad, atol=1e-5, rtol=1e-4)
    else:
        with torch.no_grad():
            got, calls = kernel_calls(lambda: c(x))
            if what != "dropout_train":
                torch.testing.assert_close(got, m(x), atol=1e-5, rtol=1e-5)
    assert calls == 0
