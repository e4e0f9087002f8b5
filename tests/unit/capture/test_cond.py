"""torch.cond (capture/cond.py): a constant predicate inlines its branch; a tensor predicate
without gradients traces both branches and selects with torch.where, in one graph; where a
gradient flows, or a branch has side effects, the call is a graph break (torch.cond runs eagerly)
with values and grads equal to eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture


def f(x, flag: bool):
    y = x.sin()
    z = torch.cond(y.sum() > 0, lambda t: t.cos() * 2, lambda t: t.exp() - 1, (y,))
    return torch.cond(flag, lambda t: t + 1, lambda t: t - 1, (z,)) * 3


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_tensor_and_constant_predicates_in_one_graph(backend):
    cf = ember.compile(f, backend=backend, fullgraph=True)
    for sign in (1.0, -1.0, 1.0):           # the tensor predicate takes both values
        x = torch.rand(6) * sign + 0.1 * sign
        torch.testing.assert_close(cf(x, True), f(x, True))
    torch.testing.assert_close(cf(x, False), f(x, False))
    st = capture.stats()
    assert st["graphs"] == 2 and st["recompiles"] == 1, st      # one per value of `flag`


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        def big(t):
            return self.a(t).relu(), t.sum(-1)

        def small(t):
            return self.b(t), t.mean(-1)
        h, s = torch.cond(x.norm() > 2.0, big, small, (x,))
        return h * s[:, None]


def test_branches_calling_submodules_under_no_grad():
    torch.manual_seed(0)
    m = Gate()
    ember.compile(m, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        for scale in (0.1, 10.0):
            x = torch.randn(3, 4) * scale
            torch.testing.assert_close(m(x), m.forward(x))
    assert capture.stats()["graphs"] == 1


def test_gradient_through_tensor_predicate_breaks_and_matches_eager():
    # torch.cond run eagerly compiles itself with Dynamo; Dynamo's automatic-dynamic memory of
    # earlier tests' calls made that inner compile fail in the full suite ("'SymNode' object
    # has no attribute 'env'", inside Dynamo's fake-tensor run; not yet understood, noted)
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Gate()
    c = ember.compile(Gate(), backend="eager", fullgraph=True)
    c.load_state_dict(m.state_dict())
    with pytest.raises(ember.Unsupported, match="gradient flows"):
        c(torch.randn(3, 4))
    ember.compile(m, backend="aot_eager")
    ref = Gate()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(3, 4) * 2
    m(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None)      # the untaken branch's: None in both
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad)
    assert capture.stats()["graph_breaks"] >= 1


def test_branch_with_side_effect_breaks_and_raises_as_eager_does():
    log = []

    def g(x):
        def noisy(t):
            log.append("true")
            return t + 1
        return torch.cond(x.sum() > 0, noisy, lambda t: t - 1, (x,))
    with pytest.raises(ember.Unsupported, match="side effects"):
        ember.compile(g, backend="eager", fullgraph=True)(torch.ones(3))
    with pytest.raises(Exception) as eager_err:
        g(torch.ones(3))
    with pytest.raises(type(eager_err.value)):      # eager torch.cond refuses the mutation
        ember.compile(g, backend="eager")(torch.ones(3))
