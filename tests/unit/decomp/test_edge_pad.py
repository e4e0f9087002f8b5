"""Reflection / replication padding decomposed into a tree of cats of flipped slices or
expanded edges (decomp/shapes.py `_edge_pad`): one kernel whose loops are split where the parts
meet. Values exactly equal to eager (a copy), gradients (ATen's backward) within float
rounding, layouts as eager's, ATen's errors kept."""
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
    assert not re.search(r"_pad\dd\.default\(", lowered), lowered    # (the backward stays aten)


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
