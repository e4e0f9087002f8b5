"""torch.func and compiled code: a compiled function called under vmap/grad (its arguments are
functorch-wrapped tensors, which no kernel can read) runs that call eagerly with one warning and
keeps its compiled entry for plain calls; torch.func transforms called inside a compiled function
are graph nodes (vjp: the output and, when vjp_fn is called, the vjp), or a graph break with one
warning (the code around them stays compiled), never inlined."""
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


def dynamo_counts(fn, *args) -> tuple[int, int]:
    """torch.compile's (graphs, breaks) for the same call: the peer."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()     # process-wide: earlier tests' breaks count too
    cnt = CompileCounter()
    torch.compile(fn, backend=cnt)(*args)
    return cnt.frame_count, torch._dynamo.utils.counters["graph_break"].total()


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_vmap_of_grad_inside_compiled_function_is_one_graph(backend):
    cf = ember.compile(per_sample_grads, backend=backend, fullgraph=True)
    torch.testing.assert_close(cf(x), per_sample_grads(x))
    torch.testing.assert_close(cf(x * 2), per_sample_grads(x * 2))
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st
    assert dynamo_counts(per_sample_grads, x)[0] == 1       # torch.compile: 1 graph too


def scan_with_built_in_dims(a, b, c):
    # HF Mamba's reference selective scan: vmap's in_dims is a tuple made in the traced code
    dims = tuple([0 if t.dim() == 2 else None for t in (a, b, c)])
    return torch.func.vmap(lambda p, q, r: (p * q).sum() + r.sum(), in_dims=dims)(a, b, c)


def test_vmap_in_dims_built_in_the_traced_code_is_one_graph():
    a, b, c = torch.randn(4, 3), torch.randn(4, 3), torch.randn(5)
    cf = ember.compile(scan_with_built_in_dims, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(cf(a, b, c), scan_with_built_in_dims(a, b, c))
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st


def test_grad_of_functional_call_inside_compiled_function():
    m = torch.nn.Linear(4, 3)
    params = {k: v.detach() for k, v in m.named_parameters()}
    cf = ember.compile(functional_grad, backend="aot_eager", fullgraph=True)
    for t in (x[0], x[1]):          # `loss` closes over t: the current one is read each call
        got = cf(m, params, t)
        want = functional_grad(m, params, t)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    assert m.weight.grad is None            # functional: the module's own grads are untouched
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0, st
    m2 = torch.nn.Linear(4, 3)              # another module object: a guard, not a stale one
    p2 = {k: v.detach() for k, v in m2.named_parameters()}
    torch.testing.assert_close(cf(m2, p2, x[0])["weight"], functional_grad(m2, p2, x[0])["weight"])


def jac_and_vmap(x, w):
    j = torch.func.jacrev(lambda v: (v * w).tanh() + torch.ones(4))(x[0])     # a factory inside
    gv = torch.func.grad_and_value(lambda v, s: (v.exp() * s).sum(), argnums=(0, 1))(x[0], w)
    y = torch.func.vmap(lambda r: r @ j, in_dims=0)(x)      # squeeze_ of a view (aot tracer)
    return y, gv


def test_jacrev_grad_and_value_vmap_with_closures_and_outer_grads():
    # higher order: the outer backward differentiates the traced transforms, equal to eager
    xs, w = torch.randn(3, 4), torch.randn(4)
    cf = ember.compile(jac_and_vmap, backend="aot_eager", fullgraph=True)
    wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
    (ya, ((ga, gsa), va)), (yb, ((gb, gsb), vb)) = cf(xs, wa), jac_and_vmap(xs, wb)
    for a, b in ((ya, yb), (ga, gb), (gsa, gsb), (va, vb)):
        torch.testing.assert_close(a, b)
    (ya.sum() + ga.sum() + va).backward()
    (yb.sum() + gb.sum() + vb).backward()
    torch.testing.assert_close(wa.grad, wb.grad)
    assert capture.stats()["graphs"] == 1


def reads_parameter(m, t):
    return torch.func.grad(lambda v: m(v).sum())(t) * 2


def has_side_effect(t, log):
    def f(v):
        log.append(1)
        return v.sin().sum()
    return torch.func.grad(f)(t).cos()


@pytest.mark.parametrize("fn, args, match", [
    (reads_parameter, (torch.nn.Linear(4, 2), x[0]), "neither an argument nor a closure"),
    (has_side_effect, (x[0], []), "closes over .log., a ListV"),
])
def test_untraceable_transforms_break_with_one_warning(fn, args, match):
    with pytest.raises(ember.Unsupported, match=match):
        ember.compile(fn, backend="eager", fullgraph=True)(*args)
    ember.reset()
    cf = ember.compile(fn, backend="aot_eager")
    with pytest.warns(UserWarning, match=match):
        got = cf(*args)
    torch.testing.assert_close(got, fn(*args))
    st = capture.stats()
    assert st["graph_breaks"] >= 1 and st.get("fallbacks", 0) == 0, st


MLP = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def per_sample_param_grads(params, xs, ys):
    def loss(p, xi, yi):
        return (torch.func.functional_call(MLP, p, (xi,)) - yi).pow(2).sum()
    return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, xs, ys)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_per_sample_grads_of_a_model_in_one_graph(backend):
    # the canonical torch.func recipe; torch.compile: 1 graph, 0 breaks (benchmarks/
    # issue28_subfunc.py). vmap's 1-D @ 2-D rule emits squeeze_ on a view (aot tracer)
    params = {k: v.detach() for k, v in MLP.named_parameters()}
    xs, ys = torch.randn(8, 4), torch.randn(8, 1)
    got = ember.compile(per_sample_param_grads, backend=backend, fullgraph=True)(params, xs, ys)
    want = per_sample_param_grads(params, xs, ys)
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    assert capture.stats()["graphs"] == 1


def uses_vjp(x, w):
    out, vjp_fn = torch.func.vjp(lambda a: (a * w).sin(), x)
    y = out.cos()                                   # out used before vjp_fn is called
    g, = vjp_fn(torch.ones_like(out) * 2)
    s_out, s_fn = torch.func.vjp(torch.sin, x)      # a torch function
    return y + g + s_fn(s_out)[0]


def uses_vjp_aux(x, w):
    out, vjp_fn, aux = torch.func.vjp(lambda p, q: ((p * q).sum(-1), p.exp()), x, w,
                                      has_aux=True)
    gx, gw = vjp_fn(torch.ones_like(out))
    return gx * aux, gw


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_vjp_inside_compiled_function_is_one_graph(backend):
    """torch.compile: 1 graph, 0 breaks for uses_vjp (asserted below)."""
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    for fn in (uses_vjp, uses_vjp_aux):
        ember.reset()
        cf = ember.compile(fn, backend=backend, fullgraph=True)
        for w_ in (b, b * 3):          # the closure over w reads the current tensor
            torch.testing.assert_close(cf(a, w_), fn(a, w_))
        st = capture.stats()
        assert st["graphs"] == 1 and st.get("graph_breaks", 0) == 0, st
    wa, wb = b.clone().requires_grad_(), b.clone().requires_grad_()   # differentiated again
    ember.compile(uses_vjp, backend=backend)(a, wa).sum().backward()
    uses_vjp(a, wb).sum().backward()
    torch.testing.assert_close(wa.grad, wb.grad)
    if backend == "eager":
        assert dynamo_counts(uses_vjp, a, b) == (1, 0)


def vjp_after_inplace(x, w):
    out, vjp_fn = torch.func.vjp(lambda a: (a * w).sin(), x)
    x.mul_(2)                   # eager's vjp_fn uses x as it was: recomputing would not
    return vjp_fn(torch.ones_like(out))[0] + out


def returns_vjp_fn(x):
    out, vjp_fn = torch.func.vjp(torch.sin, x)
    return out * 2, vjp_fn


def test_vjp_refused_where_recomputing_differs_or_vjp_fn_escapes():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(ember.Unsupported, match="after an in-place op"):
        ember.compile(vjp_after_inplace, backend="eager", fullgraph=True)(a.clone(), b)
    ember.reset()
    xa, xb = a.clone(), a.clone()
    with pytest.warns(UserWarning, match="after an in-place op"):
        got = ember.compile(vjp_after_inplace, backend="aot_eager")(xa, b)
    torch.testing.assert_close(got, vjp_after_inplace(xb, b))
    torch.testing.assert_close(xa, xb)
    assert capture.stats()["graph_breaks"] >= 1
    ember.reset()
    with pytest.warns(UserWarning, match="returning a VjpFnV"):
        out, fn = ember.compile(returns_vjp_fn, backend="aot_eager")(a)
    torch.testing.assert_close(out, a.sin() * 2)
    torch.testing.assert_close(fn(torch.ones_like(a))[0], a.cos())
