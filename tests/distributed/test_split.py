"""The DDP bucket split in one process (no process group): pieces per bucket size, each piece
its own autograd node, gradients equal to the unsplit graph's."""
from __future__ import annotations

import copy

import torch

import ember
from ember.backends import get_backend
from ember.backends.ddp import DDPSplitBackend

from .models import SmallCNN, cnn_batch, cnn_loss


def _autograd_nodes(t) -> list[str]:
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        names.append(type(n).__name__)
        stack.extend(f for f, _ in n.next_functions)
    return names


def _grads(model):
    loss = cnn_loss(model, cnn_batch(0, 0))
    nodes = _autograd_nodes(loss)
    loss.backward()
    return {k: p.grad for k, p in model.named_parameters()}, nodes


def test_split_pieces_and_grads():
    torch.manual_seed(0)
    base = SmallCNN()
    ref, _ = _grads(copy.deepcopy(base))
    for cap, want_many in ((25 * 2**20, False), (10_000, True)):
        split = DDPSplitBackend(get_backend("aot_eager"), cap)
        m = ember.compile(copy.deepcopy(base), backend=split)
        got, nodes = _grads(m)
        pieces = split.pieces_per_graph
        assert len(pieces) == 1 and (pieces[0] > 1) == want_many, pieces
        accumulate = nodes.count("AccumulateGrad")
        assert accumulate == len(ref)
        # one autograd node per piece: DDP's reducer gets each bucket when its piece is done
        assert nodes.count("EmberCompiledFunctionBackward") == pieces[0], nodes
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-4)
