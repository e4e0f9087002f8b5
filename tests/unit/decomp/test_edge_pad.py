"""Reflection / replication padding decomposed into a tree of cats of flipped slices or
expanded edges (decomp/shapes.py `_edge_pad`): one kernel whose loops are split where the parts
meet; their backward as adds of zero-padded (flipped) slices of the gradient, one kernel too.
Values exactly equal to eager (a copy), gradients within float rounding (sums in another order
where two edge parts meet), layouts as eager's, ATen's errors kept."""
import re

import pytest
import torch
import torch.nn.functional as F

import ember

CASES = [((2, 3, 7), (3, 2)), ((2, 3, 9, 11), (3, 3, 3, 3)), ((1, 5, 6, 4), (0, 3, 2, 0)),
         ((2, 2, 5, 6, 7), (1, 2, 0, 3, 4, 1)), ((3, 8, 2), (1, 1))]


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", CASES)
def test_edge_pad_values_grads_and_layout(mode, shape, pad, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    x = torch.randn(shape)
    inputs = [x]
    if x.dim() == 4:
        inputs.append(x.to(memory_format=torch.channels_last))
    for x in inputs:
        def f(t):
            return F.pad(t, pad, mode=mode) * 2
        with torch.no_grad():
            got = ember.compile(f, options={"speed_check": False})(x)
        ref = f(x)
        assert torch.equal(got, ref) and got.stride() == ref.stride(), (got.stride(), ref.stride())
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        g = torch.randn(ref.shape)
        out = ember.compile(f, options={"speed_check": False})(a)
        out.backward(g)
        f(b).backward(g)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-6)
    lowered = "\n".join(p.read_text() for p in (tmp_path / "debug").rglob("*lower.py"))
    assert not re.search(r"_pad\dd(_backward)?\.default\(", lowered), lowered


def test_reflect_pad_one_kernel_one_load_per_segment(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.randn(2, 4, 10, 12)

    def f(t):
        return F.pad(t, (3, 3, 3, 3), mode="reflect")
    with torch.no_grad():
        assert torch.equal(ember.compile(f, options={"speed_check": False})(x), f(x))
    src = "\n".join(p.read_text() for p in (tmp_path / "debug").rglob("*kernels.cpp"))
    body = src[src.index('extern "C" void kernel'):]
    assert body.count('extern "C" void kernel') == 1, body
    assert body.count("#pragma omp simd") == 9 and "?" not in body, body


@pytest.mark.parametrize("pad", [(4, 0), (-1, 2)])
def test_reflect_pad_out_of_range_or_negative_stays_aten(pad):
    x = torch.randn(2, 3, 4)

    def f(t):
        return F.pad(t, pad, mode="reflect")
    if pad[0] >= 4:
        with pytest.raises(RuntimeError):
            f(x)
        with pytest.raises(Exception):
            ember.compile(f, options={"speed_check": False})(x)
    else:
        torch.testing.assert_close(ember.compile(f, options={"speed_check": False})(x), f(x))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_edge_pad_backward_is_one_kernel(mode, tmp_path, monkeypatch):
    """The backward folds the edge parts of the gradient back: one pointwise kernel, no extern,
    gradients of a padded conv-like chain (odd sizes, asymmetric pads) as eager's."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    x = torch.randn(2, 5, 9, 13)

    def f(t):
        return F.pad(t.sin(), (3, 1, 2, 4), mode=mode) * 3
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(2, 5, 15, 17)
    ember.compile(f, options={"speed_check": False})(a).backward(g)
    f(b).backward(g)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-6)
    low = "\n".join(p.read_text() for p in (tmp_path / "debug").rglob("*backward_lower.py"))
    assert "0 externs" in low and "_backward" not in low.split("\n", 1)[1], low
    sched = "\n".join(p.read_text() for p in (tmp_path / "debug").rglob("*backward_schedule.py"))
    assert "# after schedule: 1 kernels" in sched, sched


def test_long_replicate_pad_backward_stays_aten():
    x = torch.randn(2, 3, 20, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    g = torch.randn(2, 3, 58)
    f = lambda t: F.pad(t, (19, 19), mode="replicate")  # noqa: E731
    ember.compile(f, options={"speed_check": False})(x).backward(g)
    f(y).backward(g)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-6, atol=1e-6)
