"""Capture, NumPy: arrays made from tensors are traced as torch._numpy calls (ndarrays.py).

Each program runs eagerly and compiled (fullgraph, so a refusal fails the test): the arrays and
tensors it returns must equal eager's (values, dtypes, shapes), with one graph and no recompile.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import capture

X = torch.arange(12.0).reshape(3, 4) - 5.0


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(b, np.ndarray) and np.asarray(a).dtype == b.dtype, (type(a), type(b))
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b)
    elif isinstance(a, tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b and type(a) is type(b), (a, b)


def reductions(x):
    a = x.numpy()
    m = np.mean(a, 1)
    return torch.from_numpy(np.asarray(np.sum(m))), a.max(axis=0), a.all(axis=0)


def views_and_attrs(x):
    a = x.numpy()
    return a.T, a.reshape([1, a.size]), a.transpose(0, 1), a.shape, a.ndim, a.strides, a.dtype


def arithmetic(x):
    a = x.numpy()
    return (a + 1.5) * 2, a - a, -a, a[1:, ::2], a > 0


def submodules(x):
    return np.linalg.norm(x.numpy(), axis=0), np.fft.fftshift(x.numpy())


def tensor_to_numpy_function(x):
    return np.ones_like(x, dtype=np.float64), np.full_like(x, 2.5, dtype=np.dtype("float"))


def numpy_scalar_with_tensor(x):
    return x + np.finfo(np.float32).max / 2, x * np.int64(3)


def numpy_of_constants(x):
    # BigBird's eval-mode random-attention plan: NumPy over Python constants, then a copy into
    # a tensor. The traced np.sum was a 0-d array that np.zeros refused as a shape entry
    plan = [2, 3, 1]
    blocks = [np.zeros((4, np.sum(plan[:2])), dtype=np.int32) for _ in range(2)]
    blocks = [b[1:3, :] for b in blocks]
    idx = torch.tensor(np.stack(blocks, axis=0), device=x.device, dtype=torch.long)
    first = np.arange(3) * 2        # made in the graph from its values, new on every call
    return x.sum() + idx.sum() + idx.shape[-1], torch.as_tensor(first), np.sum(plan) * 2


@pytest.mark.parametrize("fn", [reductions, views_and_attrs, arithmetic, submodules,
                                tensor_to_numpy_function, numpy_scalar_with_tensor,
                                numpy_of_constants])
def test_numpy_traced_like_eager(fn):
    cf = ember.compile(fn, backend="eager", fullgraph=True)
    for _ in range(2):
        _same(fn(X.clone()), cf(X.clone()))
    st = capture.stats()
    assert st.get("graphs", 0) == 1 and st.get("recompiles", 0) == 0, st
    assert ember.explain(fn, X.clone()).break_count == 0


def test_numpy_array_shares_memory_with_tensor():
    """`x.numpy()` returned from the frame shares x's memory, as in eager."""
    def f(x):
        return x.numpy(), x + 1

    cf = ember.compile(f, backend="eager", fullgraph=True)
    x = X.clone()
    a, _ = cf(x)
    x[0, 0] = 100.0
    assert a[0, 0] == 100.0


def test_numpy_default_backend_values():
    """The kernel backend traces the same nodes (torch._numpy is torch ops)."""
    cf = ember.compile(arithmetic)
    _same(arithmetic(X.clone()), cf(X.clone()))


@pytest.mark.parametrize("body, reason", [
    (lambda x: x.requires_grad_().numpy(), "requires grad"),
    (lambda x: np.random.rand(2) + x.numpy().sum(), "NumPy's generator"),
    (lambda x: x.numpy().tolist(), "ndarray.tolist"),
])
def test_numpy_refused_loudly(body, reason):
    cf = ember.compile(body, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported, match=reason):
        cf(X.clone())


def test_numpy_inplace_refused():
    def f(x):
        a = x.numpy()
        a += 1
        return a

    with pytest.raises(ember.Unsupported, match="in-place"):
        ember.compile(f, backend="eager", fullgraph=True)(X.clone())
    x = X.clone()
    out = ember.compile(f, backend="eager")(x)        # runs eagerly: a is x's memory
    assert float(x[0, 0]) == -4.0 and out[0, 0] == -4.0
