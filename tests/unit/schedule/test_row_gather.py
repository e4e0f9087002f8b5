"""Row gathers (#23 op sweep: bilinear upsampling at 0.7x eager): a later stage of a kernel reads
anywhere in the row an earlier stage stored in the same outer iteration. Bilinear interpolation
is separable: rows interpolated along H (contiguous), then gathered along W from that row in the
cache, with the per-column source indices as small int64 tables (lower: _index_table) and 32-bit
gather indices (codegen: index_type) so the gather loop vectorizes."""
import copy

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot import trace_aten
from ember.codegen.cpp import generate_tu
from ember.decomp import get_decompositions
from ember.loopir.index import sym
from ember.lower.lowering import GraphLowering
from ember.schedule import schedule
from ember.schedule.deps import row_gather
from tests.unit.lower.helpers import check


def _plan(fn, *args, **kw):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, list(args)).run(), **kw)
    return plan, generate_tu(plan.kernels, plan.deps, plan.buffers)[0]


def _bilinear(size=None, scale=None, align=False):
    return lambda t: F.interpolate(t, size=size, scale_factor=scale, mode="bilinear",
                                   align_corners=align)


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 7, 9), {"scale": 2}),                 # odd sizes, up
    ((2, 3, 8, 10), {"size": (13, 21)}),          # non-integer ratios
    ((1, 4, 11, 6), {"scale": 1.7}),              # non-integer scale factor
    ((2, 3, 16, 20), {"size": (9, 7)}),           # down
    ((1, 2, 1, 5), {"size": (3, 1)}),             # one source row, one output column
])
def test_bilinear_values_against_eager(shape, kw, align):
    x = torch.randn(*shape)
    check(_bilinear(align=align, **kw), x, atol=1e-5, rtol=1e-5)


def test_bilinear_is_one_row_gather_kernel():
    x = torch.randn(2, 3, 14, 14)
    plan, src = _plan(_bilinear(scale=2), x, row_gather=True)
    main = max(plan.kernels, key=lambda k: len(k.stages))
    assert [s.inner for s in main.stages] == [(14,), (28,)], main
    assert len(main.row_local) == 1 and not main.row_home       # the H-interpolated row, in cache
    body = src[src.index(f"void {main.name}("):]
    assert "int32_t idx" in body and "_row[idx" in body          # 32-bit gather from the row
    assert "static_cast<int64_t>(tmp" not in body.split("#pragma omp simd")[-1]  # tables, no cast
    # Triton (no row gather): the second pass stays a separate kernel
    plan2, _ = _plan(_bilinear(scale=2), x, row_gather=False)
    assert all(len(k.stages) == 1 for k in plan2.kernels)


@pytest.mark.parametrize("align", [False, True])
def test_bilinear_module_channels_last_and_grads(align):
    m = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1),
                            torch.nn.Upsample(scale_factor=2.5, mode="bilinear", align_corners=align))
    x = torch.randn(2, 4, 9, 7).to(memory_format=torch.channels_last).requires_grad_()
    ref_m = copy.deepcopy(m)
    cm = ember.compile(m)
    x2 = x.detach().clone().requires_grad_()
    out, ref = cm(x2), ref_m(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last) == \
        ref.is_contiguous(memory_format=torch.channels_last)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x2.grad, x.grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    assert ember.stats()["counts"].get("fallbacks", 0) == 0


def _bicubic(size=None, scale=None, align=False):
    return lambda t: F.interpolate(t, size=size, scale_factor=scale, mode="bicubic",
                                   align_corners=align)


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 7, 9), {"scale": 2}),                 # odd sizes, up: taps clamped at both edges
    ((2, 3, 8, 10), {"size": (13, 21)}),
    ((1, 4, 11, 6), {"scale": 1.7}),
    ((2, 3, 16, 20), {"scale": 0.5}),             # down (op sweep bicubic_down2: aten 0.95x)
    ((2, 3, 16, 20), {"size": (9, 7)}),
    ((1, 2, 1, 5), {"size": (3, 1)}),
])
def test_bicubic_values_against_eager(shape, kw, align):
    # ATen sums the 16 taps W inside H, ember H rows then W: the same products, other order
    x = torch.randn(*shape)
    stats = check(_bicubic(align=align, **kw), x, atol=1e-5, rtol=1e-5)
    assert not stats["fallbacks"], stats


def test_bicubic_is_one_row_gather_kernel():
    x = torch.randn(2, 3, 16, 16)
    plan, src = _plan(_bicubic(scale=0.5), x, row_gather=True)
    main = max(plan.kernels, key=lambda k: len(k.stages))
    assert [s.inner for s in main.stages] == [(16,), (8,)], main
    assert len(main.row_local) == 1 and not main.row_home
    body = src[src.index(f"void {main.name}("):]
    assert body.count("_row[idx") == 4                            # four taps gathered from the row


def test_bicubic_module_channels_last_and_grads():
    m = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1),
                            torch.nn.Upsample(scale_factor=0.5, mode="bicubic"))
    x = torch.randn(2, 4, 12, 10).to(memory_format=torch.channels_last).requires_grad_()
    ref_m = copy.deepcopy(m)
    cm = ember.compile(m)
    x2 = x.detach().clone().requires_grad_()
    out, ref = cm(x2), ref_m(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert out.stride() == ref.stride()
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x2.grad, x.grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    assert ember.stats()["counts"].get("fallbacks", 0) == 0


def test_gather_within_same_loops_is_a_later_stage():
    # y = exp(x) read reversed along the row: same loops as its producer, so it must run after
    # the whole row is stored (a new stage), never in the producer's loop
    def f(t):
        y = torch.exp(t)
        return y.flip(-1) * 2 + y
    x = torch.randn(4, 6, 37)
    check(f, x, atol=1e-5, rtol=1e-5)


def test_gathered_index_table_values():
    # a computed int64 index read along the gathered rows (not an interpolation): values as eager
    def f(t):
        idx = (torch.arange(30) * 7) % 23
        return torch.exp(t)[:, :, idx] + 1
    check(f, torch.randn(3, 5, 23), atol=1e-5, rtol=1e-5)


def test_row_gather_predicate():
    v0, v1, v2 = (sym(f"v{i}") for i in range(3))
    ind = sym("ind0")
    write = v2 + 56 * v1 + 6272 * v0
    assert row_gather(ind + 56 * v1 + 6272 * v0, write, 2, (112,), (56,), {ind: 56})
    assert not row_gather(ind + 56 * v1 + 6272 * v0, write, 2, (112,), (56,), {ind: 57})  # past the row
    assert not row_gather(ind + 56 * v1 + 56 + 6272 * v0, write, 2, (112,), (56,), {ind: 56})  # next row
    assert row_gather(55 - v2 + 56 * v1 + 6272 * v0, write, 2, (56,), (56,), {})          # reversed
    assert not row_gather(v2 + 1 + 56 * v1 + 6272 * v0, write, 2, (56,), (56,), {})     # shifted
    assert not row_gather(ind + 56 * v1 + 6272 * v0, 2 * v2 + 112 * v1 + 12544 * v0, 2, (112,),
                          (56,), {ind: 56})                                              # not dense


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 7, 9), {"scale_factor": 2}),
    ((2, 3, 8, 10), {"size": (13, 21)}),
    ((1, 4, 11, 6), {"scale_factor": 1.7}),
    ((2, 3, 16, 20), {"size": (9, 7)}),
])
def test_bilinear_backward_gathered_against_eager(shape, kw, align):
    # the gradient as a gather over each source position's window of output positions (ATen
    # scatters): values as eager's, no aten fallback, the W pass a row gather of the H pass
    aten = torch.ops.aten
    x = torch.randn(*shape)
    out = F.interpolate(x, mode="bilinear", align_corners=align, **kw)
    scales = [kw["scale_factor"]] * 2 if "scale_factor" in kw else [None, None]

    def f(g):
        return aten.upsample_bilinear2d_backward(g, list(out.shape[-2:]), list(x.shape), align, *scales)
    stats = check(f, torch.randn_like(out), atol=1e-5, rtol=1e-5)
    if out.shape[-1] < x.shape[-1]:     # downsampling keeps ATen's scatter (cheaper there)
        assert stats["fallbacks"] == ["aten.upsample_bilinear2d_backward.default"], stats
        return
    assert not stats["fallbacks"], stats
    plan, _ = _plan(f, torch.randn_like(out), row_gather=True)
    assert any(len(k.stages) == 2 and k.row_local for k in plan.kernels)
