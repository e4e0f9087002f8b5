"""Adaptive average pooling with uneven windows (30 -> 7: window sizes 5 and 6, neighbours
overlapping by one) runs as generated kernels, forward and backward, matching eager."""
import copy

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import check

aten = torch.ops.aten


@pytest.mark.parametrize("channels_last", [False, True])
def test_uneven_adaptive_avg_pool_is_kernels_not_externs(channels_last):
    # channels-last keeps eager's kernel (vectorized over C; the gathers measured 0.2x of it)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, 5, 30, 23).contiguous(memory_format=fmt)
    g = torch.randn(2, 5, 7, 6).contiguous(memory_format=fmt)
    stats = check(lambda t: F.adaptive_avg_pool2d(t, (7, 6)) * 2, x)
    assert stats["externs"] == len(stats["fallbacks"]) == int(channels_last), stats
    stats = check(lambda gg, t: aten._adaptive_avg_pool2d_backward(gg, t), g, x)
    assert stats["externs"] == len(stats["fallbacks"]) == int(channels_last), stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size,out", [((30, 30), (7, 7)), ((13, 9), (5, 4)), ((5, 7), (3, 9))])
def test_uneven_adaptive_avg_pool_training_matches_eager(size, out, dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.AdaptiveAvgPool2d(out),
                            torch.nn.Flatten(), torch.nn.Linear(8 * out[0] * out[1], 4)).to(dtype)
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    x = torch.randn(2, 3, *size, dtype=dtype)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = c(xc), ref(xe)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    got.pow(2).sum().backward()
    want.pow(2).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, **tol)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol)


def test_uneven_adaptive_avg_pool_at_a_second_size_compiles_and_matches():
    # the second size recompiles with symbolic H, W: the unroll depends on them, so that graph
    # keeps the aten calls (no eager fallback: EMBER_STRICT=1 would raise)
    from ember.capture.entry import stats as capture_stats
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(7))
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    for s in (30, 23, 19):
        x = torch.randn(2, 3, s, s)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, want = c(xc), ref(xe)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        out.pow(2).sum().backward()
        want.pow(2).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, atol=1e-5, rtol=1e-5)
    assert capture_stats().get("graphs", 0) == 2
