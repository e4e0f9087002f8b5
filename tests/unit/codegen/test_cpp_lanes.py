"""Long row reductions accumulate in lanes (docs/design/050): a float sum (or max/min) along a
simd loop of at least 4 * L iterations keeps L = 256 bytes of independent accumulators, element
k of a chunk going to lane k, combined as a fixed tree. One vector accumulator waited on the add
latency: a row sum in L1 ran 2.4x slower, a row max 1.6x. The order is stated, so a sum is
reproduced bit for bit here; values are checked against float64 with eager's own error."""
import re

import pytest
import torch

import ember
from ember.aot import trace_aten
from ember.codegen.cpp import generate_tu
from ember.codegen.cpp_reduce import CASCADE_BLOCK, LANE_BYTES
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.schedule import schedule
from tests.unit.lower.helpers import check, compile_fn


def _src(fn, *args):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, list(args)).run())
    src = generate_tu(plan.kernels, plan.deps, plan.buffers)[0]
    return src[src.index('extern "C" void kernel'):]


def _lane_sum(row: torch.Tensor) -> torch.Tensor:
    """The stated order of a float row sum with lanes: element k adds into float lane k % 64 in
    turn, then the lanes are combined as a tree (lane j += lane j + w, w = 32 ... 1)."""
    lanes = LANE_BYTES // 4
    acc = torch.zeros(lanes, dtype=torch.float32)
    for c in range(0, row.numel(), lanes):
        part = row[c:c + lanes]
        acc[:part.numel()] += part
    w = lanes // 2
    while w:
        acc[:w] += acc[w:2 * w]
        w //= 2
    return acc[0]


def _lane_order_sum(row: torch.Tensor) -> torch.Tensor:
    """The stated order for a cascaded float row sum: blocks of CASCADE_BLOCK elements, each
    summed in lanes (_lane_sum), the block's sum added into a double."""
    total = torch.zeros((), dtype=torch.float64)
    for lo in range(0, row.numel(), CASCADE_BLOCK):
        total += _lane_sum(row[lo:lo + CASCADE_BLOCK]).double()
    return total.float()


def test_long_row_sum_uses_lanes_in_the_stated_order():
    torch.manual_seed(0)
    x = torch.randn(6, 8000) * 3 + 1
    run, _ = compile_fn(lambda t: t.sum(-1), x)
    (got,) = run(x)
    want = torch.stack([_lane_order_sum(r) for r in x])
    assert torch.equal(got, want), (got - want).abs().max()
    ref = x.double().sum(-1)
    assert (got.double() - ref).abs().max() <= (x.sum(-1).double() - ref).abs().max() + 1e-6
    src = _src(lambda t: t.sum(-1), x)
    assert re.search(r"alignas\(64\) float acc\w+_l\[64\];", src), src
    assert "j < 32; ++j) acc" in src and "j < 1; ++j) acc" in src      # the tree
    assert "reduction(+:" not in src


@pytest.mark.parametrize("n", [256, 300, 1000, 5000])
def test_float_sums_and_sum_of_squares_vs_float64(n):
    # GroupNorm/LayerNorm statistics: two lane accumulators in one kernel, a tail loop when n
    # is not a multiple of 64; at least as close to float64 as eager
    torch.manual_seed(n)
    x = torch.randn(8, n) * 2 + 5

    def f(t):
        m = t.mean(-1, keepdim=True)
        return m, ((t - m) ** 2).mean(-1)
    run, _ = compile_fn(f, x)
    got = run(x)
    xd = x.double()
    md = xd.mean(-1, keepdim=True)
    for g, e, r in zip(got, f(x), (md, ((xd - md) ** 2).mean(-1))):
        err, eager_err = (g.double() - r).abs().max(), (e.double() - r).abs().max()
        assert err <= max(2 * eager_err, 1e-6 * r.abs().max()), (n, err, eager_err)
    assert "_l[64]" in _src(f, x)


def test_double_sum_uses_32_lanes():
    x = torch.randn(4, 3000, dtype=torch.float64)
    check(lambda t: t.sum(-1), x, atol=1e-12, rtol=1e-12)
    assert "alignas(64) double acc" in _src(lambda t: t.sum(-1), x)
    assert "_l[32]" in _src(lambda t: t.sum(-1), x)


def test_short_rows_keep_one_accumulator():
    x = torch.randn(64, 200)
    check(lambda t: t.sum(-1), x)
    src = _src(lambda t: t.sum(-1), x)
    assert "_l[" not in src and "reduction(+:" in src


def test_row_max_lanes_propagate_nan_and_match_eager():
    x = torch.randn(6, 4100)
    x[1, 7] = float("nan")          # in the chunked part
    x[2, 4099] = float("nan")       # in the tail (4100 = 64 * 64 + 4)
    x[3] = float("-inf")
    x[4, 100] = float("inf")
    x[5, 4098] = 1e30               # the max only in the tail
    for f in (lambda t: t.amax(-1), lambda t: t.amin(-1)):
        check(f, x, atol=0, rtol=0)
    src = _src(lambda t: t.amax(-1), x)
    assert "acc0_nan_l[64]" in src and "acc0_l[64]" in src, src


@pytest.mark.parametrize("fn", [lambda t: torch.softmax(t, -1), lambda t: torch.log_softmax(t, -1)])
def test_wide_softmax_forward_and_backward_vs_float64(fn):
    # the row max, the sum of exp and the backward's row sum of the gradient all run in lanes
    torch.manual_seed(1)
    x = torch.randn(4, 8000) * 4
    gy = torch.randn(4, 8000)

    def grads(f, t):
        t = t.clone().requires_grad_()
        y = f(t)
        (g,) = torch.autograd.grad(y, t, gy.to(t.dtype))
        return y.detach(), g
    compiled = ember.compile(fn, options={"speed_check": False})
    y, g = grads(compiled, x)
    ye, ge = grads(fn, x)
    yd, gd = grads(fn, x.double())
    for got, eager, ref in ((y, ye, yd), (g, ge, gd)):
        err, eager_err = (got.double() - ref).abs().max(), (eager.double() - ref).abs().max()
        assert err <= 2 * eager_err + 1e-7, (err, eager_err)
    assert "_l[64]" in _src(fn, x)
