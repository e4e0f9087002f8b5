"""torch.while_loop (capture/while_loop.py, backends/while_loop.py): cond_fn and body_fn traced as
subgraphs into one `ember::while_loop` node; the trip count is data-dependent and runs at run
time (a new count does not recompile); outside tensors the functions read are the node's extra
inputs; the rest of the graph is compiled around it. Side effects and gradients are a graph
break with eager's values. torch.compile keeps the same programs in one graph (counted here)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture


def f(x, n):
    y = x.sin()

    def cond(i, t):
        return i < n

    def body(i, t):
        return i + 1, t * 0.5 + y.cos()        # y: a tensor read from outside the loop
    i, t = torch.while_loop(cond, body, (torch.zeros((), dtype=torch.int64), y))
    return t * 2, i


def _torch_compile_counts(fn, *args):
    n = [0]

    def count(gm, example_inputs):
        n[0] += 1
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=count)(*args)
    return n[0]


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_data_dependent_trip_counts_in_one_graph(backend):
    cf = ember.compile(f, backend=backend, fullgraph=True)
    x = torch.randn(5)
    for n in (3, 0, 7):                      # 0: the carried values pass through
        got, want = cf(x, torch.tensor(n)), f(x, torch.tensor(n))
        torch.testing.assert_close(got, want)
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0 and st.get("breaks", 0) == 0, st
    assert _torch_compile_counts(f, x, torch.tensor(3)) == 1


def test_zero_iterations_do_not_alias_the_inputs():
    cf = ember.compile(lambda x: torch.while_loop(lambda t: t.sum() < 0, lambda t: t - 1, (x,)),
                       backend="aot_eager", fullgraph=True)
    x = torch.ones(3)
    (out,) = cf(x)
    out.add_(1)
    assert torch.equal(x, torch.ones(3)) and torch.equal(out, torch.full((3,), 2.0))


class Decay(nn.Module):
    """Applies a linear layer until the norm falls below a threshold (a parameter read inside)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("limit", torch.tensor(0.5))

    def forward(self, x):
        def cond(t):
            return t.norm() > self.limit

        def body(t):
            return (self.lin(t) * 0.5,)
        (out,) = torch.while_loop(cond, body, (x,))
        return out + 1


def test_module_parameters_read_in_the_body_under_no_grad():
    torch.manual_seed(0)
    m = Decay()
    cm = ember.compile(Decay(), fullgraph=True)
    cm.load_state_dict(m.state_dict())
    with torch.no_grad():
        for scale in (1.0, 10.0, 100.0):
            x = torch.randn(2, 4) * scale
            torch.testing.assert_close(cm(x), m(x))
    assert capture.stats()["graphs"] == 1


def test_side_effects_and_grads_break_and_run_eagerly():
    seen = []

    def noisy(x):
        def body(t):
            seen.append(1)
            return t * 0.5
        return torch.while_loop(lambda t: t.sum() > 1, body, (x,))[0] + 1
    x = torch.full((3,), 4.0)
    with pytest.raises(Exception) as eager_error:       # eager's while_loop refuses it too
        noisy(x)
    with pytest.raises(ember.Unsupported, match="side effects"):
        ember.compile(noisy, fullgraph=True)(x)
    with pytest.raises(type(eager_error.value)):
        ember.compile(noisy)(x)

    def loss(x):
        return torch.while_loop(lambda t: t.sum() > 1, lambda t: t * 0.5, (x * 1.0,))[0].sum()
    x = torch.full((3,), 4.0, requires_grad=True)
    want = loss(x)
    (want_grad,) = torch.autograd.grad(want, x)
    with pytest.raises(ember.Unsupported, match="require grad"):
        ember.compile(loss, fullgraph=True)(x)
    got = ember.compile(loss)(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, x)[0], want_grad)
