"""Row kernels over long rows (softmax over a vocabulary): the pointwise stage feeding a row
reduction runs in the reduction's loop, and a row the kernel keeps between stages lives in the
row of the output stored over it, or in a per-thread heap scratch when the row is longer than
a stack array, never in a global buffer (that cost a write and a read-back of the whole tensor:
softmax over 32000 columns ran 0.6x eager)."""
import re

import torch

from ember.aot import trace_aten
from ember.codegen.cpp import generate_tu
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.schedule import ROW_LOCAL_MAX_TRITON, schedule
from tests.unit.lower.helpers import check


def _plan(fn, *args, **kw):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, list(args)).run(), **kw)
    return plan, generate_tu(plan.kernels, plan.deps, plan.buffers)[0]


def _row_loops(src):
    return re.findall(r"for \(int64_t v1 = \w+; v1 < \w+; \+\+v1\)", src)


def test_long_row_softmax_three_passes_exp_in_output_row():
    x = torch.randn(6, 32000) * 4
    check(lambda t: torch.softmax(t, -1), x, atol=1e-6, rtol=1e-5, kernels=1)
    plan, src = _plan(lambda t: torch.softmax(t, -1), x)
    (k,) = plan.kernels
    assert len(k.row_local) == 1 and list(k.row_home.values()) == [plan.outputs[0].buffer.name]
    assert plan.writes == ((plan.outputs[0].buffer.name,),)       # no global exp buffer
    assert len(_row_loops(src)) == 3, src                           # max; exp + sum; scale
    assert "RowScratch<float>" not in src[src.index("void kernel0"):]
    assert " / " not in src[src.index("void kernel0"):]             # times 1/sum, as ATen


def test_long_row_without_a_home_uses_heap_scratch():
    # the exp row's last reader is a reduction (the entropy-like sum(p * x)): no output row to
    # hold it, and 20000 floats are too many for an OpenMP thread's stack
    def f(t):
        return (torch.softmax(t, -1) * t).sum(-1)
    x = torch.randn(4, 20000)
    check(f, x, atol=1e-4, rtol=1e-4, kernels=1)
    plan, src = _plan(f, x)
    (k,) = plan.kernels
    assert len(k.row_local) == 1 and not k.row_home
    assert "static thread_local ember::RowScratch<float>" in src, src
    assert len(plan.writes[0]) == 1


def test_short_rows_keep_a_stack_row_and_triton_bound():
    def f(t):
        return (torch.softmax(t, -1) * t).sum(-1)
    x = torch.randn(4, 64)
    check(f, x, atol=1e-5, rtol=1e-5, kernels=1)
    _, src = _plan(f, x)
    assert "alignas(64) float" in src and "RowScratch<float> " not in src
    plan, _ = _plan(f, torch.randn(2, ROW_LOCAL_MAX_TRITON + 8), row_local_max=ROW_LOCAL_MAX_TRITON)
    assert not plan.kernels[0].row_local                            # Triton: a global buffer


def test_home_row_written_after_every_read_of_the_scratch():
    # the output's row may hold the scratch only after the last stage's reads of it: here the
    # last stage reads exp at its own index and also stores a second output first
    def f(t):
        e = torch.exp(t - t.amax(-1, keepdim=True))
        s = e.sum(-1, keepdim=True)
        return e * 2.0 / s, (e + t) / s
    x = torch.randn(5, 24000)
    check(f, x, atol=1e-6, rtol=1e-5)
    plan, _ = _plan(f, x)
    homes = [h for k in plan.kernels for h in k.row_home.values()]
    assert len(homes) <= 1
