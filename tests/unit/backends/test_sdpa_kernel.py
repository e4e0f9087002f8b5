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


# ----------------------------------------------------------------- causal and other sparse masks
# (the kernel finds the keys a mask makes dead at either end of each row tile and skips them:
# docs/design/091-causal-masks.md; these must come out as eager's for any mask)
FMIN = torch.finfo(torch.float32).min


def sparse_mask(kind, b, lq, lk):
    tri = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)     # bottom-right aligned, as HF
    win = tri & torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq - 20)
    keep = torch.ones(b, 1, 1, lk, dtype=torch.bool)
    keep[-1, ..., :5] = False                # left padding of the last sequence
    keep[0, ..., lk - 7:] = False            # right padding of the first
    return {
        "bool_causal": tri.expand(b, 1, lq, lk),                # transformers 5's decoders
        "bool_window": win,                                      # mistral's sliding window
        "bool_causal_pad": tri & keep,                           # causal and padding
        "bool_pad": keep,
        "fmin_causal": torch.zeros(b, 1, lq, lk).masked_fill(~tri, FMIN),   # transformers 4
        "fmin_window_pad": torch.zeros(b, 1, lq, lk).masked_fill(~(win & keep), FMIN),
        "ninf_window": torch.zeros(lq, lk).masked_fill(~win, float("-inf")),
        "bert_pad": (1.0 - keep.float()) * -10000.0,             # old HF encoders' padding
        "bias_causal": torch.randn(b, 1, lq, lk).masked_fill(~tri, -3000.0),
    }[kind]


@pytest.mark.parametrize("kind", ["bool_causal", "bool_window", "bool_causal_pad", "bool_pad",
                                  "fmin_causal", "fmin_window_pad", "ninf_window", "bert_pad",
                                  "bias_causal"])
@pytest.mark.parametrize("b,h,lq,lk,d", [
    (2, 3, 61, 61, 32),       # 12-row tiles, key runs not multiples of 16
    (1, 2, 100, 300, 64),     # Lq < Lk: the diagonal starts at key 200
])
def test_sparse_masks_vs_eager(kind, b, h, lq, lk, d):
    g = torch.Generator().manual_seed(lq + lk + d)
    q, k, v = heads(b, lq, h, d, g), heads(b, lk, h, d, g), heads(b, lk, h, d, g)
    m = sparse_mask(kind, b, lq, lk)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)
    close(sdpa_infer(q, k, v, m, 0.3), ref)


def test_very_negative_mask_that_still_counts():
    """-2000 is not dead when the scores beat it: the keys at the ends carry a score 3000 above
    the others (a rule that took any mask <= -1024 as -inf would drop them)."""
    g = torch.Generator().manual_seed(3)
    b, h, l, d = 1, 2, 64, 32
    q, k, v = heads(b, l, h, d, g), heads(b, l, h, d, g), heads(b, l, h, d, g)
    q[..., 0] = 100.0
    k[:, :, :3, 0] = 30.0                   # q·k of the first and last 3 keys: about 3000
    k[:, :, -3:, 0] = 30.0
    m = torch.zeros(l, l)
    m[:, :3] = m[:, -3:] = -2000.0
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=1.0)
    got = sdpa_infer(q, k, v, m, 1.0)
    close(got, ref)
    assert (ref - F.scaled_dot_product_attention(q, k, v, attn_mask=m.clamp_min(-1e30).where(
        m > -1024, float("-inf")), scale=1.0)).abs().max() > 0.1     # the ends matter here


def test_bool_rows_masked_wholly_and_non_finite_queries():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 64, 32, generator=g) for _ in range(3))
    m = torch.ones(64, 64, dtype=torch.bool).tril()
    m[5] = False                            # a row with no key: 0, as eager's fused kernel
    q[1, 1, 40, 3] = float("inf")           # a query that is not finite: NaN, as eager
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    got = sdpa_infer(q, k, v, m, 32 ** -0.5)
    assert torch.equal(got.isnan(), ref.isnan()) and ref.isnan().any()
    fin = ~ref.isnan()
    close(got[fin], ref[fin])
    assert got[:, :, 5].abs().max() == 0


class Decoder(nn.Module):
    """A decoder layer as transformers 5 runs it: a bool causal mask built from aranges."""
    def __init__(self, d=64, h=4):
        super().__init__()
        self.attn = Attn(d=d, h=h)

    def forward(self, x):
        n = x.shape[1]
        i = torch.arange(n)
        mask = (i[None, :] <= i[:, None])[None, None].expand(x.shape[0], 1, n, n)
        return self.attn(x, mask)


def test_compiled_decoder_bool_causal_mask_takes_the_kernel():
    torch.manual_seed(0)
    m = Decoder().eval()
    x = torch.randn(4, 96, 256)
    c = ember.compile(Decoder().eval())
    c.load_state_dict(m.state_dict())
    with torch.no_grad():
        got, calls = kernel_calls(lambda: c(x))
        torch.testing.assert_close(got, m(x), atol=1e-5, rtol=1e-5)
    assert calls == 1
