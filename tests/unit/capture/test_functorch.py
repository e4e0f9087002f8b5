"""torch.func and compiled code: a compiled function called under vmap/grad (its arguments are
functorch-wrapped tensors, which no kernel can read) runs that call eagerly with one warning and
keeps its compiled entry for plain calls; torch.func transforms called inside a compiled function
are a graph break with one warning (the code around them stays compiled), never inlined."""
from __future__ import annotations

import pytest
import torch

import ember
from ember import capture

x, w = torch.randn(5, 3, 4), torch.randn(4, 2)


def f(x, w):
    return (x @ w).sin().sum(-1)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_compiled_function_under_vmap_and_grad_runs_that_call_eagerly(backend):
    cf = ember.compile(f, backend=backend)
    torch.testing.assert_close(cf(x[0], w), f(x[0], w))           # compiled first
    with pytest.warns(UserWarning, match="torch.func transform"):
        got = torch.func.vmap(cf, in_dims=(0, None))(x, w)
    torch.testing.assert_close(got, torch.func.vmap(f, in_dims=(0, None))(x, w))
    got = torch.func.grad(lambda t: cf(t, w).sum())(x[0])
    torch.testing.assert_close(got, torch.func.grad(lambda t: f(t, w).sum())(x[0]))
    got = torch.func.vmap(torch.func.grad(lambda t: cf(t, w).sum()))(x)
    torch.testing.assert_close(got, torch.func.vmap(torch.func.grad(lambda t: f(t, w).sum()))(x))
    torch.testing.assert_close(cf(x[1], w), f(x[1], w))            # the entry still serves
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0 and st["eager_calls"] == 3, st


def test_vmap_of_compiled_function_never_compiled_before():
    cf = ember.compile(f, backend="ember")
    with pytest.warns(UserWarning, match="torch.func transform"):
        got = torch.func.vmap(cf, in_dims=(0, None))(x, w)
    torch.testing.assert_close(got, torch.func.vmap(f, in_dims=(0, None))(x, w))
    assert capture.stats().get("graphs", 0) == 0


def per_sample_grads(t):
    t = t.cos()
    g = torch.func.vmap(torch.func.grad(lambda v: v.sin().sum()))(t)
    return g * 2


def functional_grad(m, params, t):
    def loss(p):
        return torch.func.functional_call(m, p, (t,)).pow(2).sum()
    return torch.func.grad(loss)(params)


def test_transforms_inside_compiled_function_break_with_a_warning():
    cf = ember.compile(per_sample_grads, backend="aot_eager")
    with pytest.warns(UserWarning, match="torch.func.grad is not traced"):
        torch.testing.assert_close(cf(x), per_sample_grads(x))
    torch.testing.assert_close(cf(x), per_sample_grads(x))
    st = capture.stats()
    assert st["graphs"] == 2 and st["graph_breaks"] == 3 and st.get("fallbacks", 0) == 0, st
    with pytest.raises(ember.Unsupported, match="torch.func.grad is not traced"):
        ember.compile(per_sample_grads, backend="eager", fullgraph=True)(x)


def test_grad_of_functional_call_inside_compiled_function():
    m = torch.nn.Linear(4, 3)
    params = {k: v.detach() for k, v in m.named_parameters()}
    cf = ember.compile(functional_grad, backend="aot_eager")
    with pytest.warns(UserWarning, match="torch.func.grad is not traced"):
        got = cf(m, params, x[0])
    want = functional_grad(m, params, x[0])
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    assert m.weight.grad is None            # functional: the module's own grads are untouched
