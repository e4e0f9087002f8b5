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
