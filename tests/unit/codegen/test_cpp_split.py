"""Loops split where index compares change value (cpp_ranges): a cat, pad or chunk backward
along the contiguous dim becomes one simd loop per segment with its masks decided, so each
element computes only its own input's body (no `if`, no select between bodies)."""
import pytest
import torch
import torch.nn.functional as F

import ember


def _kernels(tmp_path, pattern="*kernels.cpp"):
    src = "\n".join(p.read_text() for p in sorted((tmp_path / "debug").rglob(pattern)))
    return "\n".join(part[part.index('extern "C" void kernel'):]
                     for part in src.split("// after kernels") if 'extern "C" void kernel' in part)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_cat_last_dim_one_body_per_segment(dirs):
    a, b = torch.randn(6, 40), torch.randn(6, 24)

    def f(x, y):
        return torch.cat([x.sigmoid(), (y * 3).exp()], -1)
    got = ember.compile(f, options={"speed_check": False})(a, b)
    torch.testing.assert_close(got, f(a, b))
    k = _kernels(dirs)
    assert "if (" not in k and "pick(" not in k, k
    assert k.count("ember::sigmoid(") == 1 and k.count("ember::exp(") == 1, k
    assert "v1 = 40; v1 < 64" in k, k


@pytest.mark.parametrize("pad", [(1, 2), (3, 0), (0, 5), (-1, 2)])
def test_constant_pad_last_dim(dirs, pad):
    x = torch.randn(3, 7, 33)
    x[0, 0, 0] = float("nan")

    def f(t):
        return F.pad(t.tanh(), pad, value=-2.5) * 2
    got = ember.compile(f, options={"speed_check": False})(x)
    torch.testing.assert_close(got, f(x), equal_nan=True)
    assert "if (" not in _kernels(dirs)


def test_equality_compare_splits_out_one_column(dirs):
    x = torch.randn(5, 50)

    def f(t):
        col = torch.arange(50)
        return torch.where(col == 7, t.exp(), t * 0.5) + torch.where(col < 45, 1.0, -1.0)
    got = ember.compile(f, options={"speed_check": False})(x)
    torch.testing.assert_close(got, f(x))
    k = _kernels(dirs)
    assert "v1 = 7; v1 < 8" in k and "v1 = 45; v1 < 50" in k, k


def test_chunk_backward_swiglu_grads(dirs):
    # chunk's backward is a cat of the two halves' gradients along the last dim
    x = torch.randn(4, 9, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    g = torch.randn(4, 9, 32)

    def f(t):
        a, b = t.chunk(2, -1)
        return F.silu(a) * b
    (ref,) = torch.autograd.grad(f(x), x, g)
    (got,) = torch.autograd.grad(ember.compile(f, options={"speed_check": False})(x2), x2, g)
    torch.testing.assert_close(got, ref)
    k = _kernels(dirs, "*backward_kernels.cpp")
    assert "if (" not in k and k.count("ember::sigmoid(") == 2, k
