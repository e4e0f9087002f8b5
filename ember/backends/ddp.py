"""Backend wrapper "ddp split": cut a captured graph at DistributedDataParallel bucket boundaries.

Consumes a captured torch-level fx.GraphModule and its example inputs (parameters arrive as
placeholders whose example input is the `nn.Parameter` itself); produces a callable that runs
one compiled graph per bucket. Each piece is compiled by the inner backend separately, so each
piece's backward is its own autograd node: gradients of the parameters used last in forward
(DDP's first bucket) become ready when the backward of the last piece finishes, and DDP's reducer
starts their all-reduce while the backward of earlier pieces still runs. One graph for the whole
model would hand every gradient to the reducer at the very end, with nothing left to overlap.

Buckets follow Dynamo's DDPOptimizer: walk the graph's nodes in reverse, add the bytes of the
parameters a node first uses (reverse order is the order DDP fills its buckets), and close a
bucket when it holds at least `bucket_bytes_cap` bytes. A graph that fits in one bucket is
compiled whole. `ember.compile(ddp_model, options={"ddp_split": False})` turns the split off.

Pieces are compiled lazily, on the first call, with the real tensors flowing between them as
example inputs (so `requires_grad` of every intermediate is what it is at run time).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from .. import counters
from ..logging import get_logger

log = get_logger("graph")


def bucket_partition(gm: fx.GraphModule, example_inputs, bucket_bytes_cap: int) -> dict:
    """{node name: bucket index} with bucket 0 first in forward order (DDP's last bucket)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_bytes = {}
    for node, x in zip(placeholders, example_inputs):
        if isinstance(x, torch.nn.Parameter) and x.requires_grad:
            param_bytes[node] = x.numel() * x.element_size()
    buckets: list[list[fx.Node]] = [[]]
    size, has_params, seen = 0, False, set()
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("output", "placeholder"):
            continue
        if size >= bucket_bytes_cap and has_params:
            buckets.append([])
            size, has_params = 0, False
        buckets[-1].append(node)
        for arg in node.all_input_nodes:
            if arg in param_bytes and arg not in seen:
                seen.add(arg)
                size += param_bytes[arg]
                has_params = True
    buckets.reverse()
    return {n.name: i for i, bucket in enumerate(buckets) for n in bucket}


class _LazyPiece:
    """One bucket's graph: compiled by the inner backend on its first call."""

    def __init__(self, gm: fx.GraphModule, backend: Callable, name: str):
        self.gm, self.backend, self.name = gm, backend, name
        self.compiled = None

    def __call__(self, *args):
        if self.compiled is None:
            self.compiled = self.backend(self.gm, list(args))
        return self.compiled(*args)


class DDPSplitBackend:
    """`(gm, example_inputs) -> callable`; splits at buckets of `bucket_bytes_cap` bytes."""

    def __init__(self, inner: Callable, bucket_bytes_cap: int):
        self.inner = inner
        self.bucket_bytes_cap = int(bucket_bytes_cap)
        self.pieces_per_graph: list[int] = []   # one entry per captured graph, for tests/explain
        self.__name__ = f"ddp_split({getattr(inner, '__name__', 'backend')})"

    def __call__(self, gm: fx.GraphModule, example_inputs):
        assign = bucket_partition(gm, example_inputs, self.bucket_bytes_cap)
        n = len(set(assign.values()))
        self.pieces_per_graph.append(max(n, 1))
        if n <= 1:
            return self.inner(gm, example_inputs)
        counters.bump("ddp_split_graphs", n)
        split = split_module(gm, None, lambda node: assign[node.name],
                             keep_original_order=True)
        for name, sub in list(split.named_children()):
            delattr(split, name)
            setattr(split, name, _LazyPiece(sub, self.inner, name))
        log.info("ddp split: %d pieces at bucket_bytes_cap=%d", n, self.bucket_bytes_cap)
        # the split graph calls `self.submod_i(...)`: attribute lookups now find the pieces
        return split.forward


def bucket_bytes_cap(ddp) -> int:
    """The bucket size DDP was built with (bytes)."""
    return int(getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024))


__all__ = ["DDPSplitBackend", "bucket_partition", "bucket_bytes_cap"]
