"""ember with DistributedDataParallel on 2 gloo ranks: DDP(ember.compile(m)), ember.compile(DDP(m)),
the bucket split (more than one graph, same parameters), no_sync, find_unused_parameters,
static_graph. Every run is compared with eager DDP trained on the same data in the same test."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import ember
from ember.distributed import split_backend

from ._harness import run_ranks
from .models import (SmallCNN, assert_same_params, cnn_batch, cnn_loss, gpt2, gpt2_batch,
                     gpt2_loss, train)

BACKEND = "ember"


def _cnn_ddp(rank, world, backend):
    torch.manual_seed(0)
    base = SmallCNN()
    ref = train(DDP(copy.deepcopy(base)), cnn_loss, cnn_batch, rank)

    # DDP around a compiled module
    inner = ember.compile(copy.deepcopy(base), backend=backend)
    got = train(DDP(inner), cnn_loss, cnn_batch, rank)
    assert_same_params(ref.module, got.module)

    # compiled DDP, default buckets (25 MB: this model is one bucket, one graph)
    d = ember.compile(DDP(copy.deepcopy(base)), backend=backend)
    assert isinstance(d, DDP)
    train(d, cnn_loss, cnn_batch, rank)
    assert split_backend(d).pieces_per_graph == [1]
    assert_same_params(ref.module, d.module)

    # compiled DDP, small buckets: the graph is split at bucket boundaries
    d = ember.compile(DDP(copy.deepcopy(base), bucket_cap_mb=0.01), backend=backend)
    train(d, cnn_loss, cnn_batch, rank)
    pieces = split_backend(d).pieces_per_graph
    assert len(pieces) == 1 and pieces[0] > 1, pieces
    assert_same_params(ref.module, d.module)

    # the flag turns the split off
    d = ember.compile(DDP(copy.deepcopy(base), bucket_cap_mb=0.01), backend=backend,
                      options={"ddp_split": False})
    train(d, cnn_loss, cnn_batch, rank)
    assert split_backend(d) is None
    assert_same_params(ref.module, d.module)


def test_cnn_ddp():
    run_ranks(_cnn_ddp, BACKEND)


def _accumulate(model, rank, steps=2):
    """Gradient accumulation: two micro-batches per step, the first under no_sync()."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        with model.no_sync():
            cnn_loss(model, cnn_batch(rank, 2 * step)).backward()
        cnn_loss(model, cnn_batch(rank, 2 * step + 1)).backward()
        opt.step()
    return model


def _ddp_options(rank, world, backend):
    # no_sync() gradient accumulation; a model with an unused parameter under
    # find_unused_parameters and under static_graph
    cases = [({}, _accumulate), ({"find_unused_parameters": True}, _steps),
             ({"find_unused_parameters": True}, _accumulate), ({"static_graph": True}, _steps)]
    for kw, loop in cases:
        torch.manual_seed(0)
        base = SmallCNN(unused=bool(kw))
        ref = loop(DDP(copy.deepcopy(base), bucket_cap_mb=0.01, **kw), rank)
        d = ember.compile(DDP(copy.deepcopy(base), bucket_cap_mb=0.01, **kw), backend=backend)
        loop(d, rank)
        assert_same_params(ref.module, d.module)
        assert split_backend(d).pieces_per_graph[0] > 1
        if d.module.unused is not None:
            assert d.module.unused.weight.grad is None


def _steps(model, rank):
    return train(model, cnn_loss, cnn_batch, rank)


def test_ddp_no_sync_unused_static():
    run_ranks(_ddp_options, BACKEND)


def _gpt2_ddp(rank, world, backend, split_mb):
    base = gpt2()
    ref = train(DDP(copy.deepcopy(base)), gpt2_loss, gpt2_batch, rank)
    d = ember.compile(DDP(copy.deepcopy(base), bucket_cap_mb=split_mb), backend=backend)
    train(d, gpt2_loss, gpt2_batch, rank)
    assert_same_params(ref.module, d.module, atol=2e-5, rtol=2e-4)
    pieces = split_backend(d).pieces_per_graph
    assert pieces and pieces[0] > 1, pieces


def test_gpt2_ddp():
    run_ranks(_gpt2_ddp, BACKEND, 0.05)
