"""A user torch.autograd.Function in compiled code (#28): one graph node at capture, its forward and
the user's backward traced by aot into the joint graph. Values and grads equal eager; counts."""
from __future__ import annotations

import warnings

import pytest
import torch

import ember
from ember import capture


class ScaleGrad(torch.autograd.Function):
    """save_for_backward, a non-tensor ctx attribute, a backward that is not the true derivative."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        ctx.save_for_backward(x)
        return x.sin() * s

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.cos() * ctx.s * 2, None


class TwoOut(torch.autograd.Function):
    """Two outputs, one marked non-differentiable; needs_input_grad read in backward."""

    @staticmethod
    def forward(ctx, x, w):
        y = x @ w
        idx = y.argmax(-1)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x, w)
        return y.tanh(), idx

    @staticmethod
    def backward(ctx, gy, gidx):
        x, w = ctx.saved_tensors
        t = (x @ w).tanh()
        g = gy * (1 - t * t)
        gx = g @ w.t() if ctx.needs_input_grad[0] else None
        gw = x.t() @ g * 0.5 if ctx.needs_input_grad[1] else None
        return gx, gw


class Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.exp() + 1.0


class SetupCtx(torch.autograd.Function):
    """The forward-without-ctx style with setup_context."""

    @staticmethod
    def forward(x, k):
        return x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k * 3, None


CALLS = []


class Noisy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        CALLS.append("fwd")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Printing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        print("backward")
        return g * 2


class ItemBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2 if x.sum().item() > 0 else g * -2


FACTOR = 2.0


def _factor(g):
    return g * FACTOR


class UsesGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * FACTOR

    @staticmethod
    def backward(ctx, g):
        return _factor(g) + 1


def _scale(x, w):
    return ScaleGrad.apply(x @ w, 3.0).relu().sum()


def _two(x, w):
    y, idx = TwoOut.apply(x, w)
    return (y * idx.unsqueeze(-1).float()).sum() + y.sum()


def _once(x, w):
    return Once.apply(x @ w).sum()


def _setup(x, w):
    return SetupCtx.apply(x @ w, 1.5).pow(2).sum()


def _run(fn, backend, req=(True, True), **kw):
    torch.manual_seed(0)
    x = torch.randn(4, 5, requires_grad=req[0])
    w = torch.randn(5, 3, requires_grad=req[1])
    cf = ember.compile(fn, backend=backend, **kw)
    got, ref = [], []
    for impl, acc in ((fn, ref), (cf, got)):
        for _ in range(2):
            out = impl(x, w)
            out.backward()
            acc.append((out.detach(), *(t.grad.clone() for t in (x, w) if t.requires_grad)))
            x.grad = w.grad = None
    for a, b in zip(ref, got):
        for u, v in zip(a, b):
            torch.testing.assert_close(v, u, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize("fn", [_scale, _two, _once, _setup], ids=["scale", "two", "once", "setup"])
def test_function_in_one_graph(fn, backend):
    ember.reset()
    _run(fn, backend, fullgraph=True)
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("graph_breaks") and not st.get("fallbacks"), st


def test_needs_input_grad_follows_requires_grad():
    ember.reset()
    _run(_two, "aot_eager", req=(False, True), fullgraph=True)
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("fallbacks"), st


def test_capture_records_one_node_running_user_backward():
    ember.reset()
    e = capture.explain(_scale, torch.randn(4, 5, requires_grad=True), torch.randn(5, 3))
    assert len(e.graphs) == 1 and not e.breaks
    targets = [getattr(n.target, "__qualname__", "") for n in e.graphs[0].graph.nodes]
    assert "ScaleGrad.apply" in targets


@pytest.mark.parametrize("fn_cls,needle", [(Noisy, "'CALLS'"), (Printing, "print")])
def test_side_effects_break_and_run_eagerly(fn_cls, needle):
    ember.reset()
    CALLS.clear()

    def f(x):
        return fn_cls.apply(x.sin()).cos().sum()

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ember.errors.Unsupported, match=needle):
        ember.compile(f, backend="aot_eager", fullgraph=True)(x)
    ember.reset()
    CALLS.clear()
    cf = ember.compile(f, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            cf(x).backward()
    if fn_cls is Noisy:
        assert CALLS == ["fwd"] * 3        # per call, as eagerly
    st = ember.stats()["counts"]
    assert st.get("graph_breaks", 0) >= 1, st


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_backward_not_checked_when_grad_is_off(backend):
    """Under no_grad apply runs only forward: a backward that prints (or builds user objects,
    Reformer's reversible layers) does not break inference; with grad on it still does."""
    def f(x):
        return Printing.apply(x.sin()).cos()

    x = torch.randn(3, 4)
    ember.reset()
    cf = ember.compile(f, backend=backend, fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(cf(x), f(x), rtol=1e-6, atol=1e-6)
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("graph_breaks"), st
    with pytest.raises(ember.errors.Unsupported, match="print"):
        cf(x.requires_grad_())


class Reversible(torch.autograd.Function):
    """Reformer-style: forward runs a ModuleList and fills a caller's list."""
    @staticmethod
    def forward(ctx, x, layers, seen):
        for layer in layers:
            x = layer(x)
            seen.append(x)
        ctx.save_for_backward(x)
        ctx.layers = layers
        return x

    @staticmethod
    def backward(ctx, g):
        print("custom backward")
        return g, None, None


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_no_grad_apply_inlines_forward(backend):
    layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)])

    def f(x, seen):
        return Reversible.apply(x * 2, layers, seen) + 1

    x = torch.randn(3, 4)
    ember.reset()
    cf = ember.compile(f, backend=backend, fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            s_ref, s_got = [], []
            torch.testing.assert_close(cf(x, s_got), f(x, s_ref), rtol=1e-6, atol=1e-6)
            assert len(s_got) == len(s_ref) == 3
            for a, b in zip(s_got, s_ref):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("graph_breaks"), st


def test_data_dependent_backward_falls_back_loudly(monkeypatch):
    ember.reset()

    def f(x):
        return ItemBackward.apply(x.sin()).sum()

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ember.errors.Unsupported, match="data-dependent"):
        ember.compile(f, backend="aot_eager")(x)             # EMBER_STRICT=1 in tests
    ember.reset()
    monkeypatch.setenv("EMBER_STRICT", "0")
    cf = ember.compile(f, backend="aot_eager")
    with pytest.warns(UserWarning, match="data-dependent"):
        out = cf(x)
    out.backward()
    g = x.grad.clone()
    x.grad = None
    f(x).backward()
    torch.testing.assert_close(g, x.grad)
    assert ember.stats()["counts"].get("fallbacks", 0) >= 1


def test_globals_read_by_forward_and_backward_are_guarded():
    global FACTOR
    ember.reset()

    def f(x):
        return UsesGlobal.apply(x.sin()).sum()

    cf = ember.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, requires_grad=True)
    try:
        for factor in (2.0, 3.0):
            FACTOR = factor
            out = cf(x)
            out.backward()
            g = x.grad.clone()
            x.grad = None
            ref = f(x)
            ref.backward()
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(g, x.grad)
            x.grad = None
    finally:
        FACTOR = 2.0
    st = ember.stats()["counts"]
    assert st.get("recompiles") == 1 and not st.get("graph_breaks"), st


class ViewOut(torch.autograd.Function):
    """Returns a view of its input: aot must not rebuild that output as a view of the input's
    value (which would skip this backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 3


def _view_out(x, w):
    return ViewOut.apply(x @ w)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_view_returned_by_a_function_keeps_its_backward(backend):
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
    out = ember.compile(_view_out, backend=backend, fullgraph=True)(x, wa)
    ref = _view_out(x, wb)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(wa.grad, wb.grad)        # 3x the matmul's gradient
