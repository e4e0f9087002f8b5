"""Row reductions over a value read at v // kw and v % kw of the reduced dim (design 074):
MViTv2's decomposed relative-position softmax, softmax(attn.view(.., kh, kw) + rel_h[..., None]
+ rel_w[..., None, :]) over the kh*kw keys. Lowering stores the value once in the users' shape
(lower/lowering.py ROW_GATHERS), the row kernel keeps it as a row scratch filled by a pointwise
stage split by kw (affine loads, design 048), and the max and exp/sum passes read that row:
no pass divides its simd var, and the sum keeps the stated lane order."""
import re

import pytest
import torch

import ember
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.aot import trace_aten
from tests.unit.codegen.test_cpp_lanes import _src
from tests.unit.lower.helpers import check


def _relpos(b, h, qh, qw, kh, kw):
    def f(attn, rh, rw):
        a = attn.view(b, h, qh, qw, kh, kw) + rh[..., None] + rw[..., None, :]
        return a.view(b, h, qh * qw, kh * kw).softmax(-1)
    torch.manual_seed(0)
    args = (torch.randn(b, h, qh * qw, kh * kw) * 3, torch.randn(b, h, qh, qw, kh),
            torch.randn(b, h, qh, qw, kw))
    return f, args


def _divided(src):
    return re.findall(r"\(v\d+ [/%] \d+\)", src)


SHAPES = [(2, 1, 4, 4, 16, 16), (2, 2, 3, 5, 13, 11), (1, 1, 2, 3, 7, 7), (1, 2, 3, 2, 20, 24)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_relpos_softmax_values_one_kernel_no_divided_simd_index(shape):
    f, args = _relpos(*shape)
    check(f, *args, atol=1e-6, rtol=1e-5, kernels=1)
    src = _src(f, *args)
    assert not _divided(src), src           # was rel_h[.. + (v2 / kw)], rel_w[.. + (v2 % kw)]
    kh, kw = shape[-2:]
    assert re.search(rf"alignas\(64\) float buf\d+_row\[{kh * kw}\];", src), src   # the scratch
    # the max and exp/sum passes read the scratch over the whole row (or its lane chunks), not a
    # reduction clause per kw elements (the merged split pass, 2x slower at 14 x 14)
    for m in re.finditer(r"reduction\(\w+:acc\d+\)[^\n]*\n\s*for \(int64_t \w+ = \w+; \w+ < (\w+)", src):
        assert m.group(1) == str(kh * kw), src


def test_relpos_softmax_grads():
    f, args = _relpos(2, 2, 3, 5, 13, 11)
    leaves = [a.clone().requires_grad_() for a in args]
    comp = ember.compile(f, options={"speed_check": False})
    out = comp(*leaves)
    ref = f(*leaves)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, g)
    want = torch.autograd.grad(ref, leaves, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_relpos_softmax_nan_and_inf_rows():
    f, (attn, rh, rw) = _relpos(1, 1, 2, 2, 8, 8)
    attn[0, 0, 1, 5] = float("nan")
    rh[0, 0, 1, 0, 3] = float("-inf")
    rw[0, 0, 0, 1, 2] = float("inf")
    check(f, attn, rh, rw, atol=1e-6, rtol=1e-5, kernels=1)


def test_single_use_value_stays_inlined():
    """One user: nothing is recomputed, so the value stays inlined (no scratch)."""
    def f(attn, rh, rw):
        a = attn.view(2, 3, 6, 5) + rh[..., None] + rw[..., None, :]
        return a.view(2, 3, 30).sum(-1)
    torch.manual_seed(0)
    args = torch.randn(2, 3, 30), torch.randn(2, 3, 6), torch.randn(2, 3, 5)
    check(f, *args, atol=1e-5, rtol=1e-5, kernels=1)
    assert "_row[" not in _src(f, *args)


def test_lane_keeping_split_stays_in_the_reduction_loop():
    """A pointwise stage split by 64 into a lane sum (design 055's gated norm over merged heads)
    still runs in the sum's loop: one pass, the row stored where its square is summed."""
    def f(y, gate):
        x = y.permute(0, 2, 1, 3).reshape(2, 16, 512) * gate
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.manual_seed(0)
    args = torch.randn(2, 8, 16, 64), torch.randn(2, 16, 512)
    check(f, *args, atol=1e-5, rtol=1e-5, kernels=1)
    src = _src(f, *args)
    assert not _divided(src), src
    assert re.search(r"_row\[\(v\d+ \+ \(64 \* v\d+\)\)\] = tmp\d+;\n(.*\n){1,3}.*acc\d+_l\[", src), src


def test_pointwise_users_keep_the_value_inlined():
    """Only pointwise users: their kernel splits the dim itself (design 048); nothing stored."""
    def f(attn, rh, rw):
        a = (attn.view(2, 3, 6, 5) + rh[..., None] + rw[..., None, :]).view(2, 3, 30)
        return a.exp(), a * 2
    torch.manual_seed(0)
    args = torch.randn(2, 3, 30), torch.randn(2, 3, 6), torch.randn(2, 3, 5)
    check(f, *args, atol=1e-6, rtol=1e-6, kernels=1)
    assert not _divided(_src(f, *args))
    gm = trace_aten(f, args, decompositions=get_decompositions())
    assert [b.name for b in GraphLowering(gm, list(args)).run().nodes] == ["buf0", "buf1"]


def test_variance_consumer_keeps_the_value_inlined():
    """A LayerNorm over a value read at v // 2 (each element repeated along the row): var_mean's
    double form also reads the row's first element, so a stored value could not join the row
    kernel and would go to memory; it stays inlined (its column form reads it vectorized)."""
    def f(x):
        y = x[..., None].expand(*x.shape, 2).reshape(*x.shape[:-1], x.shape[-1] * 2)
        return torch.nn.functional.layer_norm(y, (y.shape[-1],))
    torch.manual_seed(0)
    x = torch.randn(4, 6, 150)
    check(f, x, atol=1e-5, rtol=1e-5, kernels=1)
    gm = trace_aten(f, (x,), decompositions=get_decompositions())
    assert len(GraphLowering(gm, [x]).run().nodes) == 3     # the two sums and the output
