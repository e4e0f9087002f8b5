"""ember with FSDP2 (torch.distributed.fsdp.fully_shard) on 2 gloo ranks (CPU): each FSDP unit's
forward is compiled and runs between FSDP's all-gather/reshard hooks; a unit that calls nested
FSDP units (the root) runs eagerly with one warning. Parameters after 3 SGD steps equal those of
eager FSDP trained on the same data in the same test."""
from __future__ import annotations

import copy
import warnings

import torch
from torch.distributed.fsdp import fully_shard

import ember
from ember.capture.entry import STATS

from ._harness import run_ranks
from .models import (SmallCNN, assert_same_params, cnn_batch, cnn_loss, gpt2, gpt2_batch,
                     gpt2_loss, train)

BACKEND = "ember"


def _shard(model, units):
    for m in units(model):
        fully_shard(m)
    fully_shard(model)
    return model


def _run(base, units, loss_fn, batch_fn, rank, backend, tol):
    ref = train(_shard(copy.deepcopy(base), units), loss_fn, batch_fn, rank)
    model = _shard(copy.deepcopy(base), units)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ember.compile(model, backend=backend)
        train(model, loss_fn, batch_fn, rank)
    # units of one class share compiled code (one graph, their parameters as inputs)
    assert STATS["graphs"] >= 1 and not STATS["fallbacks"] and not STATS["unsupported"], STATS
    nested = [w for w in caught if "nested FSDP units" in str(w.message)]
    assert len(nested) == 1, [str(w.message) for w in caught]
    assert_same_params(ref, model, **tol)


def _cnn_fsdp(rank, world, backend):
    torch.manual_seed(0)
    _run(SmallCNN(), lambda m: [m.c1, m.c2, m.c3, m.fc1], cnn_loss, cnn_batch, rank, backend,
         dict(atol=1e-5, rtol=1e-4))
    _data_dependent_unit(rank, backend)


class DataDependent(torch.nn.Module):
    """A unit capture cannot compile (`.item()` needs data): it must run eagerly, warned once."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y * float(y.abs().max().item() > 0)


def _data_dependent_unit(rank, backend):
    torch.manual_seed(0)
    base = torch.nn.Sequential(DataDependent(), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    units = lambda m: [m[0], m[2]]  # noqa: E731
    batch = lambda r, s: torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * r + s))  # noqa: E731
    loss = lambda m, x: m(x).square().mean()  # noqa: E731
    ref = train(_shard(copy.deepcopy(base), units), loss, batch, rank)
    model = _shard(copy.deepcopy(base), units)
    ember.compile(model, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, loss, batch, rank)
    eager = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert not eager, eager            # .item() breaks the graph of that unit; nothing falls back
    assert ember.stats()["counts"]["graph_breaks"] >= 1, ember.stats()
    assert_same_params(ref, model)


def test_cnn_fsdp():
    run_ranks(_cnn_fsdp, BACKEND)


def _gpt2_fsdp(rank, world, backend):
    _run(gpt2(), lambda m: list(m.transformer.h), gpt2_loss, gpt2_batch, rank, backend,
         dict(atol=2e-5, rtol=2e-4))


def test_gpt2_fsdp():
    run_ranks(_gpt2_fsdp, BACKEND)
