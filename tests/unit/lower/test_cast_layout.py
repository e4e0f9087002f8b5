"""lower: a dtype cast of a transposed input keeps the input's dense layout (eager's
preserve_format). An int8 weight-only linear (torchao's Int8Tensor, aot/subclass.py) traces
to `mm(x, _to_copy(permute(q), float32))`: stored row-major, the cast read the int8 weight
column by column (a transpose: 65 ms against eager's 5.5 ms for a 1024x4096 MLP at batch 1,
benchmarks/int8_weight_only.py); in the input's layout it is one linear pass."""
from __future__ import annotations

import torch

import ember
from ember.aot import trace_aten
from ember.decomp import get_decompositions
from ember.loopir.nodes import ComputedBuffer
from ember.lower.lowering import GraphLowering


def dequant_linear(x, q, scale):
    return x @ q.t().to(torch.float32) * scale


def test_cast_of_transposed_weight_keeps_its_layout():
    x, q = torch.randn(2, 64), torch.randint(-100, 100, (32, 64), dtype=torch.int8)
    scale = torch.rand(32)
    gm = trace_aten(dequant_linear, (x, q, scale), decompositions=get_decompositions())
    bufs = [n for n in GraphLowering(gm, [x, q, scale]).run().nodes
            if isinstance(n, ComputedBuffer) and tuple(int(s) for s in n.size) == (64, 32)]
    assert [tuple(int(s) for s in b.stride) for b in bufs] == [(1, 64)], bufs
    got = ember.compile(dequant_linear, backend="ember")(x, q, scale)
    torch.testing.assert_close(got, dequant_linear(x, q, scale))
