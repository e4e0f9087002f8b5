"""flex_attention in the graph (capture/flex.py, backends/flex.py, codegen/flex_cpp.py): one graph,
no break, the fused CPU kernel; values against eager flex_attention, gradients against a dense
autograd reference written here (eager flex_attention has no backward on CPU: it raises)."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import ember

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
TOL = dict(rtol=2e-5, atol=2e-5)


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv <= 40)


def qkv(B=1, H=2, L=256, D=32, HKV=None, dtype=torch.float32, grad=False, LKV=None):
    g = torch.Generator().manual_seed(0)
    shapes = [(B, H, L, D), (B, HKV or H, LKV or L, D), (B, HKV or H, LKV or L, D)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_(grad) for s in shapes]


def eager(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flex_attention(*args, **kwargs)


def counts(fn, *args):
    e = ember.explain(fn, *args)
    return e.graph_count, e.break_count


def dense(q, k, v, mask=None, score=None, scale=None):
    """Reference: scores, score_mod and mask on broadcast indices, softmax, @ v."""
    B, H, L, D = q.shape
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    b, h, qi, kj = (torch.arange(n).view([-1 if i == d else 1 for i in range(4)])
                    for d, n in enumerate((B, H, L, k.shape[2])))
    s = q @ k.transpose(-1, -2) * (scale or D ** -0.5)
    if score is not None:
        s = score(s, b, h, qi, kj)
    if mask is not None:
        s = s.masked_fill(~mask(b, h, qi, kj), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("mask", [causal, sliding])
def test_block_masks_match_eager_in_one_graph(mask):
    q, k, v = qkv()
    bm = create_block_mask(mask, None, None, 256, 256, device="cpu")

    def f(q, k, v):
        return flex_attention(q, k, v, block_mask=bm)
    assert counts(f, q, k, v) == (1, 0)
    cf = ember.compile(f, fullgraph=True)
    torch.testing.assert_close(cf(q, k, v), eager(q, k, v, block_mask=bm), **TOL)


def test_captured_bias_values_and_grads():
    L = 192                                    # not a multiple of the 128 block
    q, k, v = qkv(L=L, grad=True)
    bias = (torch.randn(2 * L - 1) * 0.5).requires_grad_()
    bm = create_block_mask(causal, None, None, L, L, device="cpu")

    def rel(score, b, h, qi, kv):
        return score + bias[qi - kv + L - 1]

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=rel, block_mask=bm)
    assert counts(f, q, k, v) == (1, 0)
    cf = ember.compile(f, fullgraph=True)
    out = cf(q, k, v)
    with torch.no_grad():
        torch.testing.assert_close(out, eager(*(t.detach() for t in (q, k, v)), score_mod=rel,
                                              block_mask=bm), **TOL)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v, bias], go)
    want = torch.autograd.grad(dense(q, k, v, causal, rel), [q, k, v, bias], go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_padding_mask_reads_lengths_and_fully_masked_rows_are_zero():
    q, k, v = qkv(B=2, L=160)
    lengths = torch.tensor([100, 37])

    def pad(b, h, qi, kv):
        return (kv < lengths[b]) & (qi < lengths[b])
    bm = create_block_mask(pad, 2, None, 160, 160, device="cpu")

    def f(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert counts(f, q, k, v) == (1, 0)
    out, lse = ember.compile(f, fullgraph=True)(q, k, v)
    ref, ref_lse = eager(q, k, v, block_mask=bm, return_lse=True)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    assert (out[1, :, 40:] == 0).all() and torch.isinf(lse[1, :, 40:]).all()


def test_gqa_scale_and_softcap():
    q, k, v = qkv(H=4, HKV=2, L=128, D=16)

    def softcap(score, b, h, qi, kv):
        return torch.tanh(score / 8) * 8 + (h == 1) * 0.5

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=softcap, scale=0.3, enable_gqa=True)
    assert counts(f, q, k, v) == (1, 0)
    torch.testing.assert_close(ember.compile(f, fullgraph=True)(q, k, v),
                               eager(q, k, v, score_mod=softcap, scale=0.3, enable_gqa=True),
                               **TOL)


def test_gqa_grads_without_block_mask_float64():
    q, k, v = qkv(H=4, HKV=1, L=64, D=8, dtype=torch.float64, grad=True)

    def f(q, k, v):
        return flex_attention(q, k, v, enable_gqa=True)
    out = ember.compile(f, fullgraph=True)(q, k, v)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v], go)
    want = torch.autograd.grad(dense(q, k, v), [q, k, v], go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_module_with_bias_parameter_trains_like_dense_reference():
    class Attn(torch.nn.Module):
        def __init__(self, L):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(8, L) * 0.1)
            self.bm = create_block_mask(causal, None, None, L, L, device="cpu")

        def forward(self, q, k, v):
            def mod(s, b, h, qi, kv):
                return s + self.bias[h, kv]
            return flex_attention(q, k, v, score_mod=mod, block_mask=self.bm)
    m = Attn(128)
    q, k, v = qkv(H=8, L=128, D=16, grad=True)
    ember.compile(m, fullgraph=True)
    out = m(q, k, v)
    out.pow(2).sum().backward()
    ref = dense(q, k, v, causal, lambda s, b, h, qi, kv: s + m.bias[h, kv])
    torch.testing.assert_close(out, ref, **TOL)
    got = [t.grad.clone() for t in (q, k, v, m.bias)]
    for t in (q, k, v, m.bias):
        t.grad = None
    ref.pow(2).sum().backward()
    for a, t in zip(got, (q, k, v, m.bias)):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-4)


def test_unsupported_is_a_graph_break_with_the_eager_value():
    q, k, v = (t.to(torch.bfloat16) for t in qkv(L=64))

    def f(q, k, v):
        return flex_attention(q, k, v) * 2
    e = ember.explain(f, q, k, v)
    assert e.break_count == 1 and "float32/float64" in str(e)
    with pytest.raises(ember.Unsupported, match="flex_attention"):
        ember.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(ember.compile(f)(q, k, v), eager(q, k, v) * 2)


def test_mod_with_data_dependent_python_breaks():
    q, k, v = qkv(L=64)

    def mod(score, b, h, qi, kv):
        return score * 2 if qi > 3 else score      # bool() of a tensor: not traceable

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=mod)
    with pytest.raises(ember.Unsupported):
        ember.compile(f, fullgraph=True)(q, k, v)


@pytest.mark.parametrize("H,HKV", [(2, 2), (4, 2)])
def test_fused_backward_softcap_document_and_padding_masks(H, HKV):
    """No floating-point capture: the fused backward kernel (dQ by query rows, dK/dV by kv
    blocks over the transposed block mask), d softcap/d score from its traced derivative."""
    L = 200
    q, k, v = qkv(B=2, H=H, HKV=HKV, L=L, D=16, grad=True)
    lengths = torch.tensor([200, 150])
    doc = torch.arange(L) // 64                     # an int tensor read by score_mod

    def mask(b, h, qi, kv):
        return (qi >= kv) & (kv < lengths[b])

    def mod(score, b, h, qi, kv):
        s = torch.tanh(score / 4) * 4
        return torch.where(doc[qi] == doc[kv], s, s - 1.0)
    bm = create_block_mask(mask, 2, None, L, L, device="cpu", BLOCK_SIZE=64)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=mod, block_mask=bm, enable_gqa=True)
    assert counts(f, q, k, v) == (1, 0)
    out = ember.compile(f, fullgraph=True)(q, k, v)
    ref = dense(q, k, v, mask, mod)
    torch.testing.assert_close(out, ref, **TOL)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v], go)
    want = torch.autograd.grad(ref, [q, k, v], go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("with_bias", [False, True])   # fused backward / dense backward
def test_lse_gradient_flows(with_bias):
    L = 96
    q, k, v = qkv(L=L, D=8, grad=True)
    bias = torch.randn(L).requires_grad_(with_bias)
    bm = create_block_mask(causal, None, None, L, L, device="cpu", BLOCK_SIZE=32)

    def mod(score, b, h, qi, kv):
        return score + bias[kv]

    def f(q, k, v):
        out, lse = flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=True)
        return out.sum() + (lse * lse).sum()
    got_loss = ember.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    wrt = [q, k, v] + ([bias] if with_bias else [])
    got = torch.autograd.grad(got_loss, wrt)

    i = torch.arange(L)
    s = (q @ k.transpose(-1, -2) * 8 ** -0.5 + bias).masked_fill(i[None, :] > i[:, None],
                                                                  float("-inf"))
    lse = torch.logsumexp(s, -1)
    loss = (torch.softmax(s, -1) @ v).sum() + (lse * lse).sum()
    torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-4)
    for a, b in zip(got, torch.autograd.grad(loss, wrt)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_new_block_mask_per_call_does_not_recompile():
    from ember import capture
    q, k, v = qkv(B=2, L=128, D=8)

    def f(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)
    cf = ember.compile(f, fullgraph=True)
    for n in ([128, 50], [20, 128], [64, 64]):
        lengths = torch.tensor(n)

        def pad(b, h, qi, kv):
            return kv < lengths[b]
        bm = create_block_mask(pad, 2, None, 128, 128, device="cpu", BLOCK_SIZE=32)
        torch.testing.assert_close(cf(q, k, v, bm), eager(q, k, v, block_mask=bm), **TOL)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0, st


def test_fused_backward_scatters_gradients_into_two_captured_tensors():
    """Gradients of tensors score_mod reads are added per loaded element (per-thread copies of
    the gradient, summed): no dense fallback. Mixed int/tensor indexing (`b2[h, 0]`) too."""
    from ember.backends import flex as kernel
    L = 160
    q, k, v = qkv(L=L, D=16, grad=True)
    b1 = (torch.randn(2 * L - 1) * 0.5).requires_grad_()
    b2 = (torch.randn(2, L) * 0.5).requires_grad_()
    bm = create_block_mask(causal, None, None, L, L, device="cpu", BLOCK_SIZE=32)

    def mod(score, b, h, qi, kv):
        return torch.tanh(score + b1[qi - kv + L - 1]) * b2[h, kv] + b2[h, 0]

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    kernel._DENSE_LOGGED.clear()
    out = ember.compile(f, fullgraph=True)(q, k, v)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v, b1, b2], go)
    want = torch.autograd.grad(dense(q, k, v, causal, mod), [q, k, v, b1, b2], go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not kernel._DENSE_LOGGED


def test_mod_indexing_a_captured_tensor_out_of_bounds_raises_like_eager():
    # the fused kernel read outside the captured buffer (garbage scores, no error); eager raises
    q, k, v = qkv(L=128)
    bias = torch.randn(128)

    def shifted(score, b, h, qi, kv):
        return score + bias[qi + kv]           # up to 254: outside bias

    def ok(score, b, h, qi, kv):
        return score + bias[kv - qi]           # -127..127: negative indices wrap, in range

    def f(q, k, v, mod):
        return flex_attention(q, k, v, score_mod=mod)
    with pytest.raises(IndexError):
        eager(q, k, v, score_mod=shifted)
    cf = ember.compile(f, fullgraph=True)
    with pytest.raises(IndexError, match="out of bounds"):
        cf(q, k, v, shifted)
    torch.testing.assert_close(cf(q, k, v, ok), eager(q, k, v, score_mod=ok), **TOL)
