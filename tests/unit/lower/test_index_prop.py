"""lower.index_prop: index tensors computed from the loop index (upsampling) become direct
indices, exactly as eager computes them; anything not provably exact stays a gather."""
import pytest
import sympy
import torch
import torch.nn.functional as F

from ember.loopir.index import FloorDiv
from ember.loopir.ops import ops
from ember.lower.index_prop import static_index, window_preimage

from .helpers import check


def _nearest(scale, clamp):
    """ATen's nearest source index: min(int64(float(i) * scale), clamp)."""
    def body(idx):
        f = ops.mul(ops.index_expr(idx[0], torch.float32), ops.constant(scale, torch.float32))
        return ops.minimum(ops.to_dtype(f, torch.int64), ops.constant(clamp, torch.int64))
    return body


def test_nearest_index_is_floordiv():
    expr, (q,) = static_index(_nearest(0.5, 55), (112,), 56)
    assert expr == FloorDiv(q, 2)
    expr, (q,) = static_index(_nearest(2.0, 111), (56,), 112)
    assert expr == 2 * q


@pytest.mark.parametrize("body,size,bound", [
    (_nearest(1 / 3, 37), (112,), 38),     # 1/3 is not exact in float32: float rounding decides
    (_nearest(0.5, 30), (112,), 56),       # the clamp acts on some rows only: not decided
    (_nearest(0.5, 55), (112,), 50),       # values up to 55 are outside a dim of 50
    (_nearest(0.5, 55), (2 ** 25,), 56),   # float(i) inexact beyond 2^24
    (lambda idx: ops.load("arg0", idx[0]), (8,), 8),                     # data, not index
    (lambda idx: ops.sub(ops.index_expr(idx[0], torch.int64), ops.constant(1, torch.int64)),
     (8,), 8),                                                           # -1 at i = 0: wraps
])
def test_not_exact_or_not_in_range_stays_a_gather(body, size, bound):
    assert static_index(body, size, bound) is None


def test_symbolic_sizes_are_left_alone():
    assert static_index(_nearest(0.5, 55), (sympy.Symbol("s0"),), 56) is None


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=0.5), dict(scale_factor=3),
                                dict(size=(37, 45)), dict(size=(8, 100)), dict(scale_factor=1.5)])
def test_nearest_interpolate_matches_eager_exactly(kw):
    x = torch.randn(2, 3, 24, 30)
    x[0, 0, 0, 0] = float("nan")
    x[1, 2, 5, 7] = float("inf")
    check(lambda t: F.interpolate(t, mode="nearest", **kw), x, atol=0, rtol=0)


def test_index_by_arange_expression_is_direct_and_exact():
    x = torch.randn(64, 50)
    check(lambda t: t[torch.arange(0, 64, 2) // 2 + 1], x, atol=0, rtol=0)


def test_window_preimage():
    q = sympy.Symbol("q", integer=True, nonnegative=True)
    assert window_preimage(FloorDiv(q, 2), q, 112, 56) == (2, 0, 2)
    assert window_preimage(FloorDiv(q, 3), q, 10, 4) == (3, 0, 3)      # last window clipped
    assert window_preimage(2 * q, q, 28, 56) is None                    # odd targets get nothing
    assert window_preimage(FloorDiv(q, 16), q, 160, 10, max_window=8) is None


@pytest.mark.parametrize("osize,isize,scale", [((16, 20), (8, 10), 2.0), ((24, 21), (8, 7), 3.0),
                                                ((17, 20), (8, 10), None)])
def test_nearest_backward_is_a_gather_sum(osize, isize, scale):
    """upsample_nearest2d_backward decomposes to an accumulating index_put: with an integer factor
    given as an exact scale (2.0) it is one kernel; otherwise the aten extern stays."""
    g = torch.randn(2, 3, *osize)
    g[0, 0, 0, 0] = float("inf")
    fn = lambda t: torch.ops.aten.upsample_nearest2d_backward(  # noqa: E731
        t, list(osize), [2, 3, *isize], scale, scale)
    stats = check(fn, g, atol=1e-6, rtol=1e-6)
    assert (stats["externs"], stats["kernels"]) == ((0, 1) if scale == 2.0 else (1, 3)), stats
