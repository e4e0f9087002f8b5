"""A collective called inside user code is never put into a graph: capture reports it as
unsupported, the frame runs eagerly with one warning, and the result is eager's."""
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
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "collective torch.distributed all_reduce" in msgs[0], msgs


def test_all_reduce_in_forward_runs_eagerly():
    run_ranks(_all_reduce)
