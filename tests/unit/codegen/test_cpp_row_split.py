"""Row kernels whose stages read an inner dim only as v // k and v % k (an RMSNorm over the
channels of a head-split [B, H, L, D] result merged to [B, L, H*D], HF Mamba2's gated norm after
its scan): the stage's loop is split into (n/k, k) as pointwise kernels' are (design 048), so
its simd loop has affine indices; g++ left the unsplit reduction loop scalar (design 055). With
lane accumulators the split keeps the stated order (element k to lane k % 64): bit for bit."""
import re

import torch
import torch.nn.functional as F

import ember
from tests.unit.codegen.test_cpp_lanes import _lane_sum, _src
from tests.unit.lower.helpers import check, compile_fn

B, H, L, D = 2, 8, 16, 64


def _gated_rms(y, gate, w):
    """RMS over C = H*D of the merged heads times silu(gate), scaled per channel."""
    x = y.permute(0, 2, 1, 3).reshape(B, L, H * D) * F.silu(gate)
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def _inputs():
    torch.manual_seed(0)
    return torch.randn(B, H, L, D), torch.randn(B, L, H * D), torch.rand(H * D) + 0.5


def _divided(src):
    return re.findall(r"\(v\d+ [/%] \d+\)", src)


def test_head_merged_rms_norm_split_values_and_affine_indices():
    y, gate, w = _inputs()
    check(_gated_rms, y, gate, w, atol=1e-5, rtol=1e-5, kernels=1)
    src = _src(_gated_rms, y, gate, w)
    assert not _divided(src), src               # was 4096*(v2 / 64) + (v2 % 64) per element
    assert re.search(r"#pragma omp simd\n\s*for \(int64_t (v\d+) = lb\d+; \1 < lb\d+ \+ 64;", src), src


def test_head_merged_rms_norm_grads():
    y, gate, w = _inputs()
    y.requires_grad_(), gate.requires_grad_(), w.requires_grad_()
    comp = ember.compile(_gated_rms)
    out = comp(y, gate, w)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (y, gate, w), g)
    want = torch.autograd.grad(_gated_rms(y, gate, w), (y, gate, w), g)
    torch.testing.assert_close(out, _gated_rms(y, gate, w), atol=1e-5, rtol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def _merged_sum(d):
    def f(y):
        b, h, n, _ = y.shape
        return y.permute(0, 2, 1, 3).reshape(b, n, h * d).sum(-1)
    return f


def _lane_ordered_split_sum(seed, heads, d):
    """The merged-heads row sum of [2, heads, 5, d] (rows of 512) compiled, checked bit for bit
    against the stated lane order over the flat row; returns whether its kernel still divides."""
    torch.manual_seed(seed)
    y = torch.randn(2, heads, 5, d) * 3 + 1
    f = _merged_sum(d)
    run, _ = compile_fn(f, y)
    (got,) = run(y)
    rows = y.permute(0, 2, 1, 3).reshape(2, 5, 512)
    want = torch.stack([torch.stack([_lane_sum(r) for r in b]) for b in rows])
    assert torch.equal(got, want), (got - want).abs().max()
    return _divided(_src(f, y))


def test_split_row_sum_keeps_the_lane_order_bitwise():
    # k = 64 = L: split into (8, 64), lane k % 64 of the flat index either way
    assert not _lane_ordered_split_sum(1, 8, 64)


def test_split_that_would_reorder_lanes_is_not_taken():
    # k = 32: a split (16, 32) would leave a 32-long simd loop without lanes; kept unsplit
    assert _lane_ordered_split_sum(2, 16, 32)


def test_split_without_lanes_values():
    # a row of 8 heads x 24 (no lanes: 192 < 256): split, values as eager
    y = torch.randn(3, 8, 7, 24)
    f = _merged_sum(24)
    check(lambda t: F.softmax(f(t), -1) + t.amax((1, 3)), y, atol=1e-5, rtol=1e-5)
    assert not _divided(_src(f, y))
