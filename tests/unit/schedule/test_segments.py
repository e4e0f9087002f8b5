"""Segmented reductions in the row kernel (schedule/segments.py,
docs/design/045-segmented-reductions.md): GroupNorm's backward sums grad*x and grad per channel,
then per group, then computes d_input, all in one kernel per (n, group) that reads grad and x
from memory once. Values and every gradient against eager in float32."""
import pytest
import torch
import torch.nn.functional as F

from ember.schedule import segments
from tests.unit.lower.helpers import check
from tests.unit.schedule.test_columns import _plan, _train_check

aten = torch.ops.aten


def _gn_args(n, c, hw, g):
    x = torch.randn(n, c, hw)
    xg = x.view(n, g, -1)
    mean, rstd = xg.mean(-1), torch.rsqrt(xg.var(-1, unbiased=False) + 1e-5)
    return [torch.randn(n, c, hw), x, mean, rstd, torch.randn(c)]


def _gn_backward(n, c, hw, g):
    def fn(dy, x, mean, rstd, w):
        return aten.native_group_norm_backward(dy, x, mean, rstd, w, n, c, hw, g, [True] * 3)
    return fn


@pytest.mark.parametrize("n,c,hw,g", [
    (16, 64, 300, 8),       # 8 channels per group: a reduction over them
    (4, 33, 35, 3),         # odd sizes, 11 channels per group
    (8, 64, 49, 32),        # 2 channels per group: their sum unrolled into loads
    (3, 6, 17, 6),          # one channel per group
])
def test_groupnorm_backward_reads_grad_once(n, c, hw, g):
    args = _gn_args(n, c, hw, g)
    fn = _gn_backward(n, c, hw, g)
    plan, src = _plan(fn, *args)
    dy, x = plan.inputs[0].name, plan.inputs[1].name
    assert sum(dy in r for r in plan.reads) == 1 and sum(x in r for r in plan.reads) == 1, \
        plan.steps
    seg = [s for k in plan.kernels for s in k.stages if s.keep]
    if c // g > 1:      # (one channel per group: the channel sums are the row kernel's own)
        assert len(seg) == 1 and seg[0].keep == 1 and seg[0].inner == (c // g, hw)
    # without the rule (Triton): the per-channel sums are their own kernel, grad is read twice
    plan2, _ = _plan(fn, *args, columns=False)
    assert sum(dy in r for r in plan2.reads) == (2 if c // g > 1 else 1)
    check(fn, *args, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n,g,row_max", [
    (4, 4, 1000),           # a group's block longer than ROW_MAX would not stay in the cache
    (1, 4, segments.ROW_MAX),   # 4 (n, group) rows: too few for the parallel loop
])
def test_segments_stay_apart(monkeypatch, n, g, row_max):
    monkeypatch.setattr(segments, "ROW_MAX", row_max)
    args = _gn_args(n, 16, 300, g)
    fn = _gn_backward(n, 16, 300, g)
    plan, _ = _plan(fn, *args)
    assert not any(s.keep for k in plan.kernels for s in k.stages)
    assert sum(plan.inputs[0].name in r for r in plan.reads) == 2
    check(fn, *args, atol=1e-4, rtol=1e-4)


class _GnSilu(torch.nn.Module):
    def __init__(self, g, c):
        super().__init__()
        self.gn = torch.nn.GroupNorm(g, c)

    def forward(self, x):
        return F.silu(self.gn(x))


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.nn.GroupNorm(8, 256), (4, 256, 37)),           # GroupNorm over 1-d data
    (lambda: torch.nn.GroupNorm(3, 33), (2, 33, 5, 7)),
    (lambda: torch.nn.GroupNorm(32, 64), (2, 64, 9, 9)),          # 2 channels per group
    (lambda: torch.nn.GroupNorm(4, 16, affine=False), (3, 16, 6, 6)),
    (lambda: _GnSilu(32, 128), (2, 128, 8, 8)),                   # UNet block: GroupNorm + SiLU
])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("threads", [None, 3])
def test_groupnorm_training_against_eager(make, shape, channels_last, threads):
    if channels_last and len(shape) != 4:
        pytest.skip("channels_last is 4-d")
    torch.manual_seed(0)
    m = make()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(*shape)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    _train_check(m, x, threads)
