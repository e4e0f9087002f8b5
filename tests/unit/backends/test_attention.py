"""Explicit attention → one fused sdpa call (ember/backends/attention.py).

Values and grads vs eager at atol=1e-5, rtol=1e-4 (float32): the fused flash kernel sums the
scores and the output in another order than bmm + softmax + bmm, so results differ in rounding
only. Counts: the rewritten chain is one extern (aten's flash kernel); as written it is two bmm.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.backends.attention import TRAIN_UNFUSED_MAX_KV, fuse_attention, fused_wins
from ember.backends.ember import STATS

TOL = dict(atol=1e-5, rtol=1e-4)
B, H, L, D = 2, 4, 24, 16


class Attention(nn.Module):
    """`softmax(q @ k^T * scale + mask) @ v`, spelled several ways (`form`)."""

    def __init__(self, form="mul", p=0.1):
        super().__init__()
        self.form, self.drop = form, nn.Dropout(p)

    def forward(self, q, k, v, mask=None):
        if self.form == "mul":
            s = q @ k.transpose(-2, -1) * (1 / math.sqrt(D))
        elif self.form == "div":
            s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D)
        else:                                   # unscaled (T5)
            s = torch.matmul(q, k.transpose(3, 2))
        if mask is not None:
            s = mask + s if self.form == "div" else s + mask
        p = self.drop(torch.softmax(s, -1) if self.form == "div" else s.softmax(dim=-1))
        return p @ v


def qkv(requires_grad=False, seed=0, n=L):
    torch.manual_seed(seed)
    return [torch.randn(B, n, H, D).transpose(1, 2).requires_grad_(requires_grad)
            for _ in range(3)]


def masks(n=L):
    pad = torch.zeros(B, 1, 1, n).masked_fill(torch.rand(B, 1, 1, n) < 0.25, float("-inf"))
    pad[..., 0] = 0.0
    causal = torch.full((n, n), float("-inf")).triu(1)
    return {"none": None, "padding": pad, "causal": causal}


def externs(fn):
    """Extern calls (library kernels) of the graphs compiled while running fn."""
    STATS.clear()
    fn()
    return sum(s["externs"] for s in STATS)


@pytest.mark.parametrize("attention", ["auto", "as_written"])
@pytest.mark.parametrize("form", ["mul", "div", "unscaled"])
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
def test_inference_values_and_form(form, mask, attention):
    m = Attention(form).eval()
    q, k, v = qkv()
    mk = masks()[mask]
    cm = ember.compile(copy.deepcopy(m), options={"attention": attention, "speed_check": False})
    with torch.no_grad():
        n = externs(lambda: torch.testing.assert_close(cm(q, k, v, mk), m(q, k, v, mk), **TOL))
    assert n == (1 if attention == "auto" else 2)      # flash, or bmm + bmm


@pytest.mark.parametrize("shape", [(B, 1, 1, L), (B, 1, L, L), (L, L)])
def test_row_masked_wholly_is_nan_as_eager(shape):
    """softmax over a row of -inf is NaN in eager's chain; the fused kernel gives 0 there: the
    rewrite puts eager's NaN back (rows of other batch entries and queries stay finite)."""
    m = Attention("mul").eval()
    q, k, v = qkv()
    mask = torch.zeros(shape)
    if len(shape) == 2:
        mask[3] = float("-inf")                 # query 3 of every batch entry and head
    elif shape[2] == 1:
        mask[0] = float("-inf")                 # every query of batch entry 0
    else:
        mask[0, :, 3] = float("-inf")           # query 3 of batch entry 0
    cm = ember.compile(copy.deepcopy(m), options={"speed_check": False})
    with torch.no_grad():
        ref = m(q, k, v, mask)
        n = externs(lambda: torch.testing.assert_close(cm(q, k, v, mask), ref, equal_nan=True,
                                                       **TOL))
    assert ref.isnan().any() and not ref.isnan().all() and n == 1


@pytest.mark.parametrize("attention", ["auto", "as_written"])
@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("n", [L, TRAIN_UNFUSED_MAX_KV + 8])
def test_training_values_and_grads(mask, attention, n):
    """Training keeps a chain over at most TRAIN_UNFUSED_MAX_KV keys as written (autograd saves
    its probabilities); a longer one runs fused."""
    m = Attention("mul", p=0.0).train()                 # p=0: the dropout is the identity
    q, k, v = qkv(requires_grad=True, n=n)
    mk = masks(n)[mask]
    cm = ember.compile(copy.deepcopy(m), options={"attention": attention, "speed_check": False})
    ref = m(q, k, v, mk)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), g)
    STATS.clear()
    out = cm(q, k, v, mk)
    got = torch.autograd.grad(out, (q, k, v), g)
    torch.testing.assert_close(out, ref, **TOL)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    # forward + backward: flash and its backward, or two bmm forward and four backward
    fused = attention == "auto" and n > TRAIN_UNFUSED_MAX_KV
    assert sum(s["externs"] for s in STATS) == (2 if fused else 6)


def test_mask_requiring_grad_keeps_the_chain():
    """The fused kernel has no mask gradient: a learned bias keeps the chain (its grad equals
    eager's)."""
    m = Attention("mul", p=0.0).train()
    q, k, v = qkv(requires_grad=True)
    bias = (torch.randn(1, H, L, L) * 0.1).requires_grad_()
    cm = ember.compile(copy.deepcopy(m), options={"speed_check": False})
    ref = m(q, k, v, bias)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v, bias), g)
    STATS.clear()
    out = cm(q, k, v, bias)
    got = torch.autograd.grad(out, (q, k, v, bias), g)
    for a, b in zip((out, *got), (ref, *want)):
        torch.testing.assert_close(a, b, **TOL)
    assert sum(s["externs"] for s in STATS) == 6


def test_probabilities_read_elsewhere_keep_the_chain():
    """`output_attentions`: the softmax is returned too, so the scores must exist."""
    def f(q, k, v):
        p = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
        return p @ v, p

    q, k, v = qkv()
    with torch.no_grad():
        n = externs(lambda: [torch.testing.assert_close(a, b, **TOL) for a, b in
                             zip(ember.compile(f, options={"speed_check": False})(q, k, v),
                                 f(q, k, v))])
    assert n == 2


def test_training_dropout_keeps_the_chain():
    """A dropout that draws numbers stays where it is (ember's RNG stream is unchanged)."""
    m = Attention("mul", p=0.5).train()
    q, k, v = qkv(requires_grad=True)
    gm = _captured(m, q, k, v)
    assert F.dropout in _targets(gm) and fuse_attention(gm, [], {}) is gm


def _captured(fn, *args):
    """The torch-level graph ember's capture makes of fn (what the backend receives)."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward
    ember.compile(fn, backend=backend)(*args)
    return seen[0]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_rule_on_shapes():
    """Inference: fused at any length. Training: unfused up to TRAIN_UNFUSED_MAX_KV keys, and
    fused past it or when the saved probabilities would pass MAX_SAVED_SCORES."""
    def t(b, h, n):
        return torch.empty(b, h, n, 64, device="meta")
    assert fused_wins(t(4, 8, 128), t(4, 8, 128), training=False)
    assert not fused_wins(t(4, 8, 128), t(4, 8, 128), training=True)
    assert fused_wins(t(1, 8, 512), t(1, 8, 512), training=True)
    assert fused_wins(t(512, 16, 256), t(512, 16, 256), training=True)      # 512 MiB of scores


def test_rewrite_where_eager_fuses():
    """The rule: rewrite where eager's fused choice takes the shapes. Heads of q and k in one
    [B, H, L, D] layout: rewritten; k and v shared by every batch ([1, H, L, D], broadcast by
    matmul): kept, since the fused kernel wants equal batch and head sizes."""
    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1) @ v

    q, k, v = qkv()
    gm = _captured(f, q, k, v)
    out = fuse_attention(gm, [], {})
    assert out is not gm and F.scaled_dot_product_attention in _targets(out)
    assert not any(t in (torch.softmax, torch.Tensor.softmax) for t in _targets(out))
    torch.testing.assert_close(out(q, k, v)[0], f(q, k, v), **TOL)

    k1, v1 = k[:1], v[:1]
    gm = _captured(f, q, k1, v1)
    assert fuse_attention(gm, [], {}) is gm
    assert fuse_attention(gm := _captured(f, q, k, v), [], {"attention": "as_written"}) is gm


def test_mask_broadcasting_the_scores_keeps_the_chain():
    """A mask with more batch rows than q: the chain's output has the mask's batch, which the
    fused call would not give."""
    def f(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + mask, -1) @ v

    q, k, v = (t[:1] for t in qkv())
    mask = torch.randn(3, 1, L, L)
    gm = _captured(f, q, k, v, mask)
    assert fuse_attention(gm, [], {}) is gm


def test_bad_option_value():
    with pytest.raises(ValueError, match="attention"):
        ember.compile(lambda x: x, options={"attention": "bmm"})


def test_permuted_keys_and_3d_bias():
    """LeViT / EfficientFormer: `q @ k * scale + bias` with k already [B, H, D, L] (a permute)
    and a per-head bias [H, L, L]: rewritten (k transposed back, the bias given a batch dim)."""
    def f(q, kp, v, bias):
        return ((q @ kp) * 0.25 + bias).softmax(dim=-1) @ v

    q, k, v = qkv()
    kp = k.permute(0, 1, 3, 2)
    bias = torch.randn(H, L, L)
    gm = _captured(f, q, kp, v, bias)
    out = fuse_attention(gm, [], {})
    assert F.scaled_dot_product_attention in _targets(out)
    torch.testing.assert_close(out(q, kp, v, bias)[0], f(q, kp, v, bias), **TOL)
    with torch.no_grad():
        n = externs(lambda: torch.testing.assert_close(
            ember.compile(f, options={"speed_check": False})(q, kp, v, bias), f(q, kp, v, bias),
            **TOL))
    assert n == 1
