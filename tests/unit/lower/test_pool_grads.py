"""Max pooling end to end (ember.compile, forward and backward) in both layouts vs eager."""
import pytest
import torch
import torch.nn.functional as F

import ember


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "plain"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["nchw", "cl"])
def test_max_pool_grads_equal_eager_both_layouts(fmt, relu):
    """resnet's stem (relu → 3x3/2 pad 1 max pool) with -inf and NaN inputs: the output, its
    layout and the input gradient (scattered through the indices: an all -inf window routes it
    to its first in-bounds tap) equal eager exactly, from generated kernels."""
    x = torch.randn(2, 32, 12, 14)
    x[0, :, :4, :4] = float("-inf")
    x[1, 2, 5, 5] = float("nan")
    x = x.contiguous(memory_format=fmt)

    def fn(t):
        t = t * 2
        return F.max_pool2d(torch.relu(t) if relu else t, 3, 2, 1)

    ember.reset()
    compiled = ember.compile(fn, fullgraph=True)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, got = fn(a), compiled(b)
    torch.testing.assert_close(got, ref, atol=0, rtol=0, equal_nan=True)
    assert got.stride() == ref.stride()
    g = torch.randn_like(ref)
    ref.backward(g)
    got.backward(g)
    torch.testing.assert_close(b.grad, a.grad, atol=0, rtol=0, equal_nan=True)
    counts = ember.stats()["counts"]
    assert counts["graphs"] == 1 and counts["kernel_graphs"] == 2, counts


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["nchw", "cl"])
def test_avg_pool_padding_not_counted_generated_both_layouts(fmt):
    """poolformer's token mixer, avg_pool2d(3, 1, 1, count_include_pad=False)(y) - y: forward
    and backward are generated kernels (they were aten externs: the NCHW forward kernel ran
    ~12x slower than the decomposition), equal to eager in float64 in value, layout and
    input gradient, edges (windows cut by the padding) included."""
    x = torch.randn(2, 5, 9, 11, dtype=torch.float64).contiguous(memory_format=fmt)

    def fn(t):
        y = t * 2 + 1
        return F.avg_pool2d(y, 3, 1, 1, count_include_pad=False) - y

    ember.reset()
    compiled = ember.compile(fn, fullgraph=True)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = fn(a)
    g = torch.randn_like(ref)
    ref.backward(g)
    compiled(x.clone().requires_grad_()).backward(g)     # compiles (outside the mode below)
    with torch.profiler.profile() as prof:      # an extern fallback is an aten event there
        got = compiled(b)
        got.backward(g)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-12)
    assert got.stride() == ref.stride()
    torch.testing.assert_close(b.grad, a.grad, atol=1e-12, rtol=1e-12)
    assert b.grad.stride() == a.grad.stride()
    counts = ember.stats()["counts"]
    assert counts["graphs"] == 1 and counts["kernel_graphs"] == 2, counts
    assert not [e.key for e in prof.key_averages() if "avg_pool2d" in e.key]
