"""A collective called inside user code is never put into a graph: capture breaks the graph
there, runs the collective eagerly on real tensors and resumes; the result is eager's."""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

import ember

from ._harness import run_ranks


class AllReduceInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        dist.all_reduce(y)
        return y * 2


def _all_reduce(rank, world):
    torch.manual_seed(0)
    m = AllReduceInForward()
    x = torch.full((2, 4), float(rank + 1))
    expected = m(x)
    ember.compile(m, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = m(x)
        got2 = m(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got2, expected)
    assert not [str(w.message) for w in caught]
    counts = ember.stats()["counts"]
    assert counts["graph_breaks"] == 1 and counts.get("fallbacks", 0) == 0, counts
    e = ember.explain(AllReduceInForward.forward, m, x)
    assert "collective torch.distributed all_reduce" in e.breaks[0].reason, e


def test_all_reduce_in_forward_breaks_the_graph():
    run_ranks(_all_reduce)
