"""torch.library.custom_op in compiled code (#28): one opaque node traced through its fake kernel,
autograd through its registered formula, the kernel backend calling it as an extern."""
from __future__ import annotations

import warnings

import pytest
import torch

import ember

CALLS = []


@torch.library.custom_op("embertest28::mysin", mutates_args=())
def mysin(x: torch.Tensor) -> torch.Tensor:
    CALLS.append("mysin")
    return x.sin()


@mysin.register_fake
def _(x):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, g):
    x, = ctx.saved_tensors
    return g * x.cos() * 2          # deliberately not the true derivative: the formula is used


mysin.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("embertest28::nofake", mutates_args=())
def nofake(x: torch.Tensor) -> torch.Tensor:
    return x.cos()


@torch.library.custom_op("embertest28::addin", mutates_args=("x",))
def addin(x: torch.Tensor, y: torch.Tensor) -> None:
    x.add_(y)


@addin.register_fake
def _(x, y):
    return None


def _f(x):
    return mysin(x * 2).sum() + torch.ops.embertest28.mysin(x).exp().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_custom_op_in_graph_with_registered_autograd(backend):
    ember.reset()
    x = torch.randn(5, requires_grad=True)
    cf = ember.compile(_f, backend=backend, fullgraph=True)
    for _ in range(2):
        CALLS.clear()
        out = cf(x)
        out.backward()
        assert CALLS == ["mysin", "mysin"]     # the real kernel runs per call
        g = x.grad.clone()
        x.grad = None
        ref = _f(x)
        ref.backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(g, x.grad)
        x.grad = None
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("graph_breaks") and not st.get("fallbacks"), st


def test_no_fake_kernel_names_the_op():
    ember.reset()

    def g(x):
        return nofake(x * 2).sum()

    x = torch.randn(3)
    with pytest.raises(ember.errors.Unsupported, match="embertest28::nofake has no fake kernel"):
        ember.compile(g, backend="aot_eager", fullgraph=True)(x)
    ember.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(ember.compile(g, backend="aot_eager")(x), g(x))
    assert ember.stats()["counts"].get("graph_breaks", 0) == 1


@pytest.mark.parametrize("capture,backend", [("ember", "aot_eager"), ("ember", "ember"),
                                             ("dynamo", "ember")])
def test_mutating_custom_op_is_functionalized(capture, backend):
    """A custom op that writes an argument (an intermediate and a graph input) runs on clones
    through ember_functional::embertest28__addin_default_*; the input is written back once."""
    ember.reset()

    def h(x, y, acc):
        z = x * 1
        addin(z, y)                          # the custom_op object
        torch.ops.embertest28.addin(acc, z)  # the packet, writing a graph input
        return z * 2

    x, y = torch.randn(3), torch.randn(3)
    acc, acc_ref = torch.zeros(3), torch.zeros(3)
    cf = ember.compile(h, backend=backend, fullgraph=True) if capture == "ember" else \
        torch.compile(h, backend=ember.backend, fullgraph=True)
    for _ in range(2):                       # the second call runs the cached graph
        torch.testing.assert_close(cf(x, y, acc), h(x, y, acc_ref))
        torch.testing.assert_close(acc, acc_ref)
    if capture == "ember":
        st = ember.stats()["counts"]
        assert st.get("graphs") == 1 and not st.get("graph_breaks") and not st.get("fallbacks")


@pytest.fixture
def raw_copy_op():
    """A library op with a plain kernel (no autograd formula), as Inductor's
    test_mutable_custom_op_fixed_layout defines it."""
    with torch.library._scoped_library("embertest27", "DEF") as lib:
        lib.define("copy_(Tensor(a!) dst, Tensor src) -> ()")
        lib.impl("copy_", lambda dst, src: None, "Meta")
        lib.impl("copy_", lambda dst, src: [dst.copy_(src), None][1], "CompositeExplicitAutograd")
        yield torch.ops.embertest27.copy_.default


@pytest.mark.parametrize("capture", ["ember", "dynamo"])
def test_raw_mutating_library_op(raw_copy_op, capture):
    ember.reset()

    def f(x):
        full = torch.full([3], 7.0)
        raw_copy_op(full, x)
        return full * full

    x = torch.arange(3, dtype=torch.float)
    cf = ember.compile(f, fullgraph=True) if capture == "ember" else \
        torch.compile(f, backend=ember.backend, fullgraph=True)
    torch.testing.assert_close(cf(x), f(x))


def test_raw_mutating_op_refused_under_grad(raw_copy_op):
    """No derivative for the functional form: refused loudly rather than a wrong gradient."""
    ember.reset()

    def g(x, y):
        raw_copy_op(y, x * 2)
        return y * x

    x = torch.arange(3, dtype=torch.float, requires_grad=True)
    with pytest.raises(ember.errors.Unsupported, match="require grad"):
        ember.compile(g, fullgraph=True)(x, torch.zeros(3))
