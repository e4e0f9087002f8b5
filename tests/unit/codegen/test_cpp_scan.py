"""Scans (cumsum) as C++ kernels (codegen/cpp_scan.py, docs/design/064): the scanned dim walked
sequentially, an accumulator per lane — the inner elements (one simd row add per step) when the
scanned dim has dims after it, ROWS rows at a time when it is the innermost. The accumulator is
eager's CPU acc type (double for float) and the order is eager's, so float32 results are equal
bit for bit. A cumsum's gradient (flip, cumsum, flip) is one reverse scan of the incoming
gradient, returned without a copy."""
import re

import pytest
import torch

import ember
from ember.aot import trace_aten
from ember.codegen.cpp import generate_tu
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.schedule import schedule
from tests.unit.lower.helpers import compile_fn


def _src(fn, *args):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, list(args)).run())
    src = generate_tu(plan.kernels, plan.deps, plan.buffers)[0]
    return src[src.index('extern "C" void kernel'):]


SCANS = [((16, 64, 32), 1), ((16, 64, 32), 0), ((16, 64, 32), -1), ((300,), 0),
         ((3, 19, 6, 5), 1), ((5, 1, 7), 1), ((13, 40), -1), ((2, 3, 4), 2)]


@pytest.mark.parametrize("shape,dim", SCANS)
def test_cumsum_values_and_grads_equal_eager(shape, dim):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    g = torch.randn(*shape)

    def f(t):
        return torch.cumsum(t * 1.5, dim) - 1.0
    c = ember.compile(f, fullgraph=True)
    y = c(x)
    y.backward(g)
    gx, x.grad = x.grad, None
    ye = f(x)
    ye.backward(g)
    assert torch.equal(y, ye), (y - ye).abs().max()
    assert torch.equal(gx, x.grad), (gx - x.grad).abs().max()


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.float64, torch.bfloat16])
def test_cumsum_dtypes(dtype):
    torch.manual_seed(0)
    x = (torch.randn(7, 50, 9) * 20).to(dtype)
    for dim in (1, -1):
        for out in (None, torch.float32):
            fn = (lambda t: torch.cumsum(t, dim, dtype=out))
            run, stats = compile_fn(fn, x)
            (got,) = run(x)
            ref = fn(x)
            assert got.dtype == ref.dtype and stats["externs"] == 0, stats
            if ref.dtype == torch.bfloat16:     # float accumulator, each sum rounded: eager's
                torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=1e-1)
            else:
                assert torch.equal(got, ref), (dtype, dim, out)


def test_outer_dim_scan_is_a_simd_row_add():
    x = torch.randn(64, 128, 96)
    src = _src(lambda t: torch.cumsum(t, 1), x)
    assert "cumsum" not in src
    assert "alignas(64) double acc[96];" in src
    loop = src[src.index("for (int64_t v1 = 0; v1 < 128; ++v1)"):]
    assert re.match(r"for \(int64_t v1 = 0; v1 < 128; \+\+v1\)\s*\{\s*#pragma omp simd\s*"
                    r"for \(int64_t v2 = 0; v2 < 96; \+\+v2\)", loop), loop[:300]
    assert "acc[v2] += static_cast<double>(" in src


def test_scan_over_dim0_runs_chunks_in_parallel_with_accumulators_in_l1():
    """cumsum over dim 0 of [8, 512, 768]: no point before the scanned dim, so the 512 rows
    of the inner elements are cut into chunks of 2 (2 x 768 double accumulators, 12 KB), each
    scanned over the 8 steps by one thread."""
    x = torch.randn(8, 512, 768)
    src = _src(lambda t: torch.cumsum(t, 0), x)
    assert re.search(r"#pragma omp parallel for\s*for \(int64_t v3 = 0; v3 < 256; \+\+v3\)", src)
    assert "alignas(64) double acc[1536];" in src
    assert "v1 < std::min<int64_t>((2 + (2 * v3)), 512)" in src


def test_last_dim_scan_runs_rows_together():
    x = torch.randn(20, 4096)
    src = _src(lambda t: torch.cumsum(t, -1), x)
    assert "double acc[8] = {};" in src
    assert "std::min<int64_t>(8, 20 - 8 * v2)" in src
    for k in range(8):      # a whole block: each row's chain written out
        assert f"acc[{k}] += static_cast<double>(" in src
    assert "acc[v3] += static_cast<double>(" in src     # the last block's rows


def test_large_stored_last_dim_scan_stays_aten():
    """The cost rule: a stored input scanned along rows and larger than SCAN_STREAM_BYTES is
    ATen's (one row at a time streams as fast); with a producer to fuse it is a scan."""
    x = torch.randn(8, 512, 768)
    _, stats = compile_fn(lambda t: torch.cumsum(t, -1), x)
    assert stats["externs"] == 1 and stats["kernels"] == 0, stats
    run, stats = compile_fn(lambda t: torch.cumsum(t * 2, -1), x)
    assert stats["externs"] == 0 and stats["kernels"] == 1, stats
    assert torch.equal(run(x)[0], torch.cumsum(x * 2, -1))


def test_cumsum_gradient_is_one_reverse_scan():
    """flip(cumsum(flip(g))), the graph autograd makes for cumsum's backward: one kernel that
    reads g in place from the end and writes the output (no flip copies, no aten call)."""
    g = torch.randn(4, 33, 5)
    fn = (lambda t: torch.flip(torch.cumsum(torch.flip(t, [1]), 1), [1]))
    run, stats = compile_fn(fn, g)
    assert torch.equal(run(g)[0], fn(g))
    assert stats["kernels"] == 1 and stats["externs"] == 0, stats
    src = _src(fn, g)
    assert "for (int64_t v1 = 32; v1 >= 0; --v1)" in src
    assert "2016" not in src and "-" not in re.sub(r"--v1|>= 0", "", src.split("{", 1)[1])


def test_flipped_copy_output_keeps_its_own_storage():
    """An output that only copies a stored buffer is returned as that buffer, unless another
    output returns it too."""
    x = torch.randn(4, 33, 5)
    fn = (lambda t: (torch.cumsum(t, 1), torch.flip(torch.flip(torch.cumsum(t, 1), [1]), [1])))
    run, _ = compile_fn(fn, x)
    a, b = run(x)
    assert a.data_ptr() != b.data_ptr()
    assert torch.equal(a, fn(x)[0]) and torch.equal(b, fn(x)[1])


def test_in_place_cumsum_of_an_input_is_scanned():
    """x.cumsum_(1) stores the scan into the caller's x: a scan kernel reading x at the index it
    writes is no copy onto itself (the wrapper skips those), the values are eager's."""
    def f(t):
        t.cumsum_(1)
        return t
    x = torch.randn(4, 50, 8)
    xe = x.clone()
    with torch.no_grad():
        ember.compile(f)(x)
        f(xe)
    assert torch.equal(x, xe), (x - xe).abs().max()
