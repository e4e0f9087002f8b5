"""Capture semantics found missing by PyTorch's own Dynamo tests (tests/peer/dynamo_runner.py),
each minimized to the construct, checked against eager with graph/break/recompile counts."""
from __future__ import annotations

import torch

import ember
from ember import capture

from .helpers import same


def _counts():
    return ember.stats()["counts"]


def test_dynamo_graph_break_splits_the_graph():
    import torch._dynamo

    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos() + 1

    cf = ember.compile(f, backend="eager")
    x = torch.randn(3)
    for _ in range(2):
        same(f(x), cf(x))
    c = _counts()
    assert c.get("graphs") == 2 and c.get("graph_breaks") == 1 and not c.get("recompiles"), c
    e = capture.explain(f, x)
    assert len(e.breaks) == 1 and "graph_break" in e.breaks[0].reason


def test_set_from_closure_guarded_by_contents():
    s = {1, 2}

    def f(x):
        return torch.cos(x) * len(s)

    cf = ember.compile(f, backend="eager", fullgraph=True)
    x = torch.rand(4)
    same(f(x), cf(x))
    s.add(3)                        # the guard compared the set with itself: stale len 2
    same(f(x), cf(x))
    same(f(x), cf(x))
    c = _counts()
    assert c.get("graphs") == 2 and c.get("recompiles") == 1, c


def test_tensor_instance_attribute_guarded():
    def f(x):
        if hasattr(x, "tag"):
            return x + x.tag
        return x + 1

    cf = ember.compile(f, backend="eager", fullgraph=True)
    a = torch.ones(2, 2)
    same(f(a), cf(a))
    b = torch.ones(2, 2)
    b.tag = 5
    same(f(b), cf(b))               # hasattr was False on the first input, unguarded
    same(f(a), cf(a))
    c = _counts()
    assert c.get("graphs") == 2 and c.get("recompiles") == 1, c
    b.tag = 7                       # the value read is guarded too
    same(f(b), cf(b))
