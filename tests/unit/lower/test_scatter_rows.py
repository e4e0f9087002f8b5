"""lower: a scatter with one index per row along its dim is a pointwise kernel (one-hot targets,
nll_loss's backward), equal to eager bit for bit, bounds-checked like eager; other scatters stay
aten externs."""
import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import check, compile_fn


@pytest.mark.parametrize("fn,dtype", [
    (lambda a, i: torch.zeros_like(a).scatter(1, i, -1.0), torch.float32),
    (lambda a, i: a.scatter(1, i, a * 2), torch.float32),
    (lambda a, i: a.scatter(1, i, 7), torch.int64),
    (lambda a, i: a.scatter(-1, i, a + 1), torch.bfloat16),
    (lambda a, i: a.scatter_add(1, i, a * 2) - a, torch.float32),
])
def test_one_index_per_row_is_one_kernel(fn, dtype):
    x = (torch.randn(16, 80) * 4).to(dtype)
    i = torch.randint(0, 80, (16, 1))
    stats = check(fn, x, i, atol=0, rtol=0)
    assert stats["kernels"] == 1 and stats["externs"] == 0, stats


def test_index_along_dim0_and_3d():
    x = torch.randn(16, 80)
    check(lambda a, i: a.scatter(0, i, 3.5), x, torch.randint(0, 16, (1, 80)), atol=0, rtol=0)
    y = torch.randn(4, 6, 9)
    check(lambda a, i: a.scatter(1, i, a[:, :1] * 3), y, torch.randint(0, 6, (4, 1, 9)), atol=0, rtol=0)


def test_general_scatter_stays_an_extern():
    z = torch.tensor(2.0)                              # 0-d (max over a 0-d input's backward)
    check(lambda a, i: torch.zeros_like(a).scatter(0, i, a), z, torch.tensor(0), atol=0, rtol=0)
    x = torch.randn(16, 80)
    # (an index of x's size but at dim: a Scatter kernel, tests/unit/codegen/test_cpp_scatter.py)
    # index narrower than x in another dim: rows past it are not written
    stats = check(lambda a, i: a.scatter(1, i, 2.0), x, torch.randint(0, 80, (10, 1)))
    assert stats["externs"] == 1, stats


def test_index_out_of_range_raises_like_eager():
    x, i = torch.randn(16, 80), torch.randint(0, 80, (16, 1))
    run, _ = compile_fn(lambda a, t: torch.zeros_like(a).scatter(1, t, -1.0), x, i)
    i[3, 0] = 80
    with pytest.raises(IndexError):
        run(x, i)


def test_segmentation_cross_entropy_backward_runs():
    """nll_loss2d's backward: a scatter over C of NCHW whose checked simd loop g++ 12 once
    miscompiled (segfault) when negative indices were remapped out of range."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, 16, requires_grad=True)
    t = torch.randint(0, 5, (2, 8, 16))
    t[0, 0, :3] = -100
    f = ember.compile(lambda a, b: F.cross_entropy(a, b))
    (g1,) = torch.autograd.grad(F.cross_entropy(x, t), x)
    x2 = x.detach().clone().requires_grad_()
    (g2,) = torch.autograd.grad(f(x2, t), x2)
    torch.testing.assert_close(g2, g1, atol=1e-7, rtol=1e-5)


def test_cross_entropy_training_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(32, 100, requires_grad=True)
    t = torch.randint(0, 100, (32,))
    t[5] = -100
    f = lambda a, b: F.cross_entropy(a, b, label_smoothing=0.0)  # noqa: E731
    g = ember.compile(f)
    ref = f(x, t)
    (gx,) = torch.autograd.grad(ref, x)
    x2 = x.detach().clone().requires_grad_()
    got = g(x2, t)
    (gx2,) = torch.autograd.grad(got, x2)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(gx2, gx, atol=1e-7, rtol=1e-5)


def test_dynamic_sizes_keep_the_extern():
    f = ember.compile(lambda a, i: torch.zeros_like(a).scatter(1, i, -1.0), dynamic=True)
    for n in (8, 12):
        x, i = torch.randn(n, 30), torch.randint(0, 30, (n, 1))
        torch.testing.assert_close(f(x, i), torch.zeros_like(x).scatter(1, i, -1.0), atol=0, rtol=0)


def _wrapper_source(tmp_path):
    return "\n".join(p.read_text() for p in (tmp_path / "debug").rglob("*wrapper.py"))


@pytest.mark.parametrize("shape,dtype", [((50, 16), torch.float32), ((50, 3, 5), torch.float64),
                                         ((50, 16), torch.bfloat16)])
def test_row_accumulate_is_index_add_in_place(shape, dtype, tmp_path, monkeypatch):
    """index_put(zeros, [idx], values, accumulate=True) (embedding's backward, index_add over dim
    0): one index kernel, a zero fill and aten.index_add_ into the fill (no clone), duplicate
    rows summed in index order as eager does (bit for bit), negative indices wrapped as
    index_put does; a self that is an input is cloned by the functional index_add."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (4, 7))
    idx[0, 0], idx[1, 1], idx[3, :4] = -3, idx[2, 2], 9             # negative, duplicates
    v = torch.randn(4, 7, *shape[1:]).to(dtype)
    stats = check(lambda i, g: torch.zeros(shape, dtype=dtype).index_put((i,), g, True), idx, v,
                  atol=0, rtol=0)
    if dtype == torch.bfloat16:     # eager rounds after each add: index_put stays the extern
        assert (stats["kernels"], stats["externs"]) == (1, 1), stats
        return
    assert (stats["kernels"], stats["externs"]) == (2, 1), stats
    f = ember.compile(lambda i, g: torch.zeros(shape, dtype=dtype).index_put((i,), g, True),
                      options={"speed_check": False})
    assert torch.equal(f(idx, v), torch.zeros(shape, dtype=dtype).index_put((idx,), v, True))
    assert "aten_index_add__default(" in _wrapper_source(tmp_path)
    x = torch.randn(shape).to(dtype)
    stats = check(lambda a, i, g: a.index_put((i,), g, True), x, idx, v, atol=0, rtol=0)
    assert (stats["kernels"], stats["externs"]) == (1, 1), stats
    stats = check(lambda a, i, g: torch.ones_like(a).index_add(0, i, g, alpha=2), x, idx[3], v[3],
                  atol=0, rtol=0)
    assert stats["externs"] == 1 and not stats["fallbacks"], stats


def test_row_accumulate_index_out_of_range_raises():
    run, _ = compile_fn(lambda i, g: torch.zeros(50, 16).index_put((i,), g, True),
                        torch.randint(0, 50, (30,)), torch.randn(30, 16))
    for bad in (50, -51):
        i = torch.randint(0, 50, (30,))
        i[7] = bad
        with pytest.raises((IndexError, RuntimeError)):
            run(i, torch.randn(30, 16))


def test_embedding_training_matches_eager():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 12)
    idx = torch.randint(0, 100, (3, 9))
    idx[0, :3] = 5                                    # repeated rows accumulate
    ref = emb(idx)
    go = torch.randn_like(ref)
    (gw,) = torch.autograd.grad(ref, emb.weight, go)
    m = ember.compile(torch.nn.Embedding(100, 12))
    m.load_state_dict(emb.state_dict())
    (gw2,) = torch.autograd.grad(m(idx), m.weight, go)
    torch.testing.assert_close(gw2, gw, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("padding_idx", [None, 0, 7])
def test_embedding_backward_padding_without_gradient_copy(padding_idx, tmp_path, monkeypatch):
    """Rows at padding_idx get no gradient: their tokens are sent to an extra row that is sliced
    off, so the backward is one small index kernel, a zero fill and index_add_ of the incoming
    gradient itself (a where(idx != padding_idx, grad, 0) copied all of it first)."""
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    emb = torch.nn.Embedding(40, 24, padding_idx=padding_idx)
    idx = torch.randint(0, 40, (3, 50))
    idx[0, :5], idx[1, :4] = 0, 7                     # padding tokens, repeated
    go = torch.randn(3, 50, 24)
    (gw,) = torch.autograd.grad(emb(idx), emb.weight, go)
    m = ember.compile(torch.nn.Embedding(40, 24, padding_idx=padding_idx),
                      options={"speed_check": False})
    m.load_state_dict(emb.state_dict())
    (gw2,) = torch.autograd.grad(m(idx), m.weight, go)
    torch.testing.assert_close(gw2, gw, atol=1e-6, rtol=1e-6)
    assert gw2.shape == gw.shape and gw2.stride() == gw.stride()
    if padding_idx is not None:
        assert gw2[padding_idx].abs().max() == 0
    src = "\n".join(p.read_text() for p in (tmp_path / "debug").rglob("*backward_kernels.cpp"))
    kernels = src[src.index('extern "C" void kernel'):]
    assert "const float*" not in kernels, kernels     # no kernel reads floats: no copy (a fill)
