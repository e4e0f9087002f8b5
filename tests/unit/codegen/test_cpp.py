"""C++ codegen on small hand-built loop IR: loop planning, pragmas, tails and dtypes."""
import re
import subprocess

import numpy as np
import pytest
import sympy
import torch

from ember.loopir.index import FloorDiv, ModularIndexing, sym
from ember.loopir.ops import ops
from ember.codegen.cpp import cexpr, generate_tu
from ember.codegen import cpp_ranges
from ember.codegen.cpp_loops import plan_loops
from ember.loopir.nodes import ComputedBuffer, InputBuffer, Pointwise, Reduction
from ember.runtime.build import CXX, FLAGS, build, load
from ember.schedule.deps import node_deps
from ember.schedule.fuse import fuse
from ember.schedule.memory import mark_locals


def test_plan_loops_merges_contiguous_dims_only():
    v0, v1, v2 = sym("v0"), sym("v1"), sym("v2")
    sizes, vars_, subs = plan_loops([4, 5, 6], [v0, v1, v2], [30 * v0 + 6 * v1 + v2])
    assert sizes == [120] and vars_ == [v2] and subs == {v0: 0, v1: 0}
    sizes, _, _ = plan_loops([4, 5, 6], [v0, v1, v2], [30 * v0 + 6 * v1 + v2, v0 + 4 * v1])
    assert sizes == [4, 5, 6]
    sizes, _, _ = plan_loops([4, 5, 6], [v0, v1, v2], [30 * v0 + 6 * v1 + v2, 6 * v1 + v2])
    assert sizes == [4, 30]
    sizes, _, _ = plan_loops([4, 6], [v0, v1], [FloorDiv(6 * v0 + v1, 4)])
    assert sizes == [4, 6]


def test_cexpr_prints_div_mod():
    x = sym("v0")
    assert cexpr(ModularIndexing(x, sympy.Integer(3), sympy.Integer(5))) == "((v0 / 3) % 5)"
    assert cexpr(FloorDiv(x, sympy.Integer(4))) == "(v0 / 4)"
    assert cexpr(sympy.Integer(2 ** 40)) == "1099511627776LL"


def _compile(nodes, inputs):
    deps = {n.name: node_deps(n) for n in nodes}
    steps = fuse(nodes, deps)
    mark_locals(steps, deps, keep={nodes[-1].name})
    buffers = {b.name: b for b in inputs + nodes}
    src, sigs = generate_tu(steps, deps, buffers)
    return steps, src, load(build(src), sigs), sigs


def test_handbuilt_softmax_rows_is_one_kernel_with_pragmas(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    n, d = 300, 257   # odd sizes: SIMD tails
    x = InputBuffer("arg0", torch.float32, (n, d), (d, 1), position=0)
    xl = x.loader()
    mx = ComputedBuffer("buf0", torch.float32, (n, 1), (1, 1), body=Reduction(
        (n, 1), (d,), "max", torch.float32, torch.float32, lambda i, r: xl([i[0], r[0]])))
    sm = ComputedBuffer("buf1", torch.float32, (n, 1), (1, 1), body=Reduction(
        (n, 1), (d,), "sum", torch.float32, torch.float32,
        lambda i, r: ops.exp(ops.sub(xl([i[0], r[0]]), mx.loader()([i[0], 0])))))
    out = ComputedBuffer("buf2", torch.float32, (n, d), (d, 1), body=Pointwise(
        (n, d), torch.float32, lambda i: ops.truediv(
            ops.exp(ops.sub(xl(i), mx.loader()([i[0], 0]))), sm.loader()([i[0], 0]))))
    steps, src, fns, sigs = _compile([mx, sm, out], [x])
    assert len(steps) == 1 and steps[0].local == {"buf0", "buf1"}
    assert "#pragma omp parallel for" in src and "#pragma omp simd" in src
    t = torch.randn(n, d)
    res = torch.empty(n, d)
    fns[steps[0].name](*[{"arg0": t, "buf2": res}[a].data_ptr() for a in sigs[steps[0].name]])
    torch.testing.assert_close(res, torch.softmax(t, -1))


def test_bf16_storage_fp32_accumulation(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    n = 4099
    x = InputBuffer("arg0", torch.bfloat16, (n,), (1,), position=0)
    s = ComputedBuffer("buf0", torch.bfloat16, (), (), body=Reduction(
        (), (n,), "sum", torch.bfloat16, torch.float32, lambda i, r: x.loader()([r[0]])))
    steps, src, fns, sigs = _compile([s], [x])
    assert "float acc" in src
    t = torch.ones(n, dtype=torch.bfloat16)
    res = torch.empty((), dtype=torch.bfloat16)
    fns[steps[0].name](t.data_ptr(), res.data_ptr())
    assert res.item() == torch.tensor(float(n)).bfloat16().item()


def _window_max(x, n, h, w, step, other):
    """out[i, j] = max over a 2-wide window of x at (step*j - 1 + k), masked at the left edge."""
    xl = x.loader()

    def body(i):
        best = None
        for k in range(2):
            col = step * i[1] - 1 + k
            m = ops.ge(ops.index_expr(col, torch.int64), ops.constant(0, torch.int64))
            v = ops.masked(m, lambda col=col: xl([i[0], col]), other)
            best = v if best is None else ops.where(
                ops.logical_or(ops.gt(v, best), ops.isnan(v)), v, best)
        return best
    return ComputedBuffer("buf0", torch.float32, (n, w), (w, 1), body=Pointwise(
        (n, w), torch.float32, body))


def test_masked_strided_load_is_branch_free_and_safe(tmp_path, monkeypatch):
    """A masked load with a strided index (max pooling) clamps its index into the buffer and
    selects: no `if`, vectorizable; a contiguous one, whose mask changes at one point of the
    simd loop, splits that loop there (cpp_ranges): each part has its mask decided, no `if`.
    Values (NaN included) match the reference either way."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    n, h = 5, 34
    x = InputBuffer("arg0", torch.float32, (n, h), (h, 1), position=0)
    t = torch.randn(n, h)
    t[1, 7] = float("nan")
    pad = torch.nn.functional.pad(t, (1, 0), value=float("-inf"))
    for step, w in ((2, h // 2), (1, h)):
        steps, src, fns, sigs = _compile([_window_max(x, n, h, w, step, float("-inf"))], [x])
        kernel = src[src.index('extern "C"'):]
        assert "if (" not in kernel, kernel
        assert ("std::min<int32_t>" in kernel) == (step == 2), kernel
        assert (f"for (int64_t v1 = 1; v1 < {h}; ++v1)" in kernel) == (step == 1), kernel
        res = torch.empty(n, w)
        fns[steps[0].name](*[{"arg0": t, "buf0": res}[a].data_ptr() for a in sigs[steps[0].name]])
        windows = pad.unfold(1, 2, step)[:, :w]
        exp = torch.where(windows.isnan().any(-1), float("nan"), windows.amax(-1))
        torch.testing.assert_close(res, exp, equal_nan=True)


def test_column_reduction_with_broadcast_load_along_reduced_dim(tmp_path, monkeypatch):
    # sum over rows of (x - mean[row]) * g: mean moves with the reduced dim only, one value per
    # block, so the kernel still vectorizes across columns (blocked form), not a strided walk
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    n, d = 300, 70
    x = InputBuffer("arg0", torch.float32, (n, d), (d, 1), position=0)
    mu = InputBuffer("arg1", torch.float32, (n,), (1,), position=1)
    xl, ml = x.loader(), mu.loader()
    out = ComputedBuffer("buf0", torch.float32, (d,), (1,), body=Reduction(
        (d,), (n,), "sum", torch.float32, torch.float32,
        lambda i, r: ops.mul(ops.sub(xl([r[0], i[0]]), ml([r[0]])), xl([r[0], i[0]]))))
    steps, src, fns, sigs = _compile([out], [x, mu])
    assert "blk" in src
    t, m = torch.randn(n, d), torch.randn(n)
    res = torch.empty(d)
    fns[steps[0].name](*[{"arg0": t, "arg1": m, "buf0": res}[a].data_ptr() for a in sigs[steps[0].name]])
    torch.testing.assert_close(res, ((t - m[:, None]) * t).sum(0), atol=1e-4, rtol=1e-4)


def _run(steps, fns, sigs, bufs):
    fns[steps[0].name](*[bufs[a].data_ptr() for a in sigs[steps[0].name]])


def test_column_reduction_with_transposed_store(tmp_path, monkeypatch):
    # LayerNorm over C of an NCHW tensor written channels-last (ConvNeXt's / EdgeNeXt's permute +
    # LayerNorm): the loads run along W, the store along C. Vectorized across W (blocked form,
    # strided stores) instead of gathering every element down C in each stage
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    n, c, hw = 2, 24, 70
    x = InputBuffer("arg0", torch.float32, (n, c, hw), (c * hw, hw, 1), position=0)
    xl = x.loader()
    mean = ComputedBuffer("buf0", torch.float32, (n, hw), (hw, 1), body=Reduction(
        (n, hw), (c,), "sum", torch.float32, torch.float32, lambda i, r: xl([i[0], r[0], i[1]])))
    ml = mean.loader()
    out = ComputedBuffer("buf1", torch.float32, (n, hw, c), (hw * c, c, 1), body=Pointwise(
        (n, hw, c), torch.float32,
        lambda i: ops.sub(xl([i[0], i[2], i[1]]), ops.mul(ml([i[0], i[1]]), 1.0 / c))))
    steps, src, fns, sigs = _compile([mean, out], [x])
    assert len(steps) == 1 and "acc0[" in src, src
    t = torch.randn(n, c, hw)
    res = torch.empty(n, hw, c)
    _run(steps, fns, sigs, {"arg0": t, "buf1": res})
    torch.testing.assert_close(res, (t - t.mean(1, keepdim=True)).permute(0, 2, 1),
                               atol=1e-6, rtol=1e-6)


def test_row_reduction_over_gathered_rows_stays_row_form(tmp_path, monkeypatch):
    # LayerNorm's shifted sum over a cat of strided slices (Swin's patch merging): the row's
    # address holds the outer index only inside div/mod (coefficient 0) but moves with it. Row
    # form (contiguous along the reduced dim), not the blocked column form that gathered each
    # element across rows (3x slower than eager's cat + layer_norm)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    h, c = 8, 16
    x = InputBuffer("arg0", torch.float32, (h, h, c), (h * c, c, 1), position=0)
    n = (h // 2) ** 2
    shift = InputBuffer("arg1", torch.float32, (n,), (1,), position=1)
    xl, sl = x.loader(), shift.loader()

    def load(i, r):                         # row i of the [h/2 * h/2, 2c] gather, element r
        row, col = FloorDiv(i, h // 2), ModularIndexing(i, sympy.Integer(1), sympy.Integer(h // 2))
        lo = ops.lt(ops.index_expr(r, torch.int64), ops.constant(c, torch.int64))
        return ops.where(lo, ops.masked(lo, lambda: xl([2 * row, 2 * col, r]), 0.0),
                         ops.masked(ops.logical_not(lo),
                                    lambda: xl([2 * row + 1, 2 * col, r - c]), 0.0))
    out = ComputedBuffer("buf0", torch.float32, (n,), (1,), body=Reduction(
        (n,), (2 * c,), "sum", torch.float32, torch.float32,
        lambda i, r: ops.sub(load(i[0], r[0]), sl([i[0]]))))
    steps, src, fns, sigs = _compile([out], [x, shift])
    assert "blk" not in src, src
    t, sh = torch.randn(h, h, c), torch.randn(n)
    res = torch.empty(n)
    _run(steps, fns, sigs, {"arg0": t, "arg1": sh, "buf0": res})
    exp = (torch.cat([t[0::2, 0::2], t[1::2, 0::2]], -1).reshape(n, 2 * c) - sh[:, None]).sum(-1)
    torch.testing.assert_close(res, exp, atol=1e-5, rtol=1e-5)


def test_row_reduction_over_embedding_rows_stays_row_form(tmp_path, monkeypatch):
    # LayerNorm's shifted sum over embedding rows (BERT/OPT: LayerNorm(embed(ids))): the index
    # load moves with the outer dim (coefficient 1) but the gathered row is contiguous along the
    # reduced dim. Row form, not the blocked column form that gathered each element across rows
    # (OPT's embedding LayerNorm: 1.97 ms against eager's 0.60, thread CPU)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    v, d, n = 50, 32, 64
    w = InputBuffer("arg0", torch.float32, (v, d), (d, 1), position=0)
    ids = InputBuffer("arg1", torch.int64, (n,), (1,), position=1)
    wl, il = w.loader(), ids.loader()
    out = ComputedBuffer("buf0", torch.float32, (n,), (1,), body=Reduction(
        (n,), (d,), "sum", torch.float32, torch.float32,
        lambda i, r: ops.sub(wl([ops.indirect_indexing(il([i[0]]), v), r[0]]),
                             wl([ops.indirect_indexing(il([i[0]]), v), sympy.Integer(0)]))))
    steps, src, fns, sigs = _compile([out], [w, ids])
    assert "blk" not in src, src
    t, ix = torch.randn(v, d), torch.randint(0, v, (n,))
    res = torch.empty(n)
    _run(steps, fns, sigs, {"arg0": t, "arg1": ix, "buf0": res})
    torch.testing.assert_close(res, (t[ix] - t[ix, :1]).sum(-1), atol=1e-5, rtol=1e-5)


def test_long_float_sums_are_cascaded(tmp_path, monkeypatch):
    # BatchNorm statistics: 100k elements per channel, along rows (NCHW) and down columns (NHWC).
    # A float accumulator drifts by ~sqrt(n) ulps (1e-5 relative here, 20x eager's error on
    # lraspp's activations); a cascaded one (float blocks added into a double) stays at float's
    # rounding of the result
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    c, n = 64, 100_000
    rows = InputBuffer("arg0", torch.float32, (c, n), (n, 1), position=0)
    cols = InputBuffer("arg1", torch.float32, (n, c), (c, 1), position=1)
    rl, cl = rows.loader(), cols.loader()
    t = torch.rand(c, n) + 1.0
    for inp, load_, arg in ((rows, lambda i, r: rl([i[0], r[0]]), t),
                            (cols, lambda i, r: cl([r[0], i[0]]), t.t().contiguous())):
        s = ComputedBuffer("buf0", torch.float32, (c,), (1,), body=Reduction(
            (c,), (n,), "sum", torch.float32, torch.float32, load_))
        steps, src, fns, sigs = _compile([s], [inp])
        assert "double acc" in src and "float acc0_b" in src, src
        res = torch.empty(c)
        _run(steps, fns, sigs, {inp.name: arg, "buf0": res})
        ref = t.double().sum(1)
        assert float(((res.double() - ref) / ref).abs().max()) < 2e-7


@pytest.mark.parametrize("shape, dims", [
    ((1 << 20,), (0,)),                 # one sum to a scalar: per-thread partials, omp for blocks
    ((8, 4, 128, 256), (0, 2, 3)),      # BatchNorm over N, H, W (NCHW): a row per N, chunked
    ((1 << 17, 4, 7), (0, 2)),          # short last dim (7): blocks of whole rows of dim 0
    ((1 << 18, 4), (0,)),               # down columns (channels last)
])
def test_cascaded_sum_error_within_float_rounding(tmp_path, monkeypatch, shape, dims):
    """A float32 sum over ~1M elements keeps within 1e-7 * sum|x| of the float64 sum (float's
    own rounding of the result is up to 6e-8 of it; measured 0.4-3.3e-8); with a plain float
    accumulator each case is 2.3e-7 to 1.4e-5 off."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(0)
    t = torch.rand(*shape, generator=g) + 0.5
    keep = [d for d in range(len(shape)) if d not in dims]
    out_shape = [shape[d] for d in keep]
    x = InputBuffer("arg0", torch.float32, shape, t.stride(), position=0)
    xl = x.loader()

    def load(i, r):
        idx, it, ir = [], iter(i), iter(r)
        for d in range(len(shape)):
            idx.append(next(ir) if d in dims else next(it))
        return xl(idx)
    strides = torch.empty(out_shape).stride()
    s = ComputedBuffer("buf0", torch.float32, tuple(out_shape), strides, body=Reduction(
        tuple(out_shape), tuple(shape[d] for d in dims), "sum", torch.float32, torch.float32,
        load))
    steps, src, fns, sigs = _compile([s], [x])
    assert "_b = 0.0f" in src, src
    res = torch.empty(out_shape)
    _run(steps, fns, sigs, {"arg0": t, "buf0": res})
    ref = t.double().sum(dims)
    scale = t.double().abs().sum(dims)
    assert float(((res.double() - ref) / scale).abs().max()) < 1e-7
    if len(shape) == 1:     # a plain float accumulator (numpy's sequential cumsum) fails it
        naive = float(np.cumsum(t.numpy())[-1])
        assert abs(naive - float(ref)) / float(scale) > 2e-6


def test_cascaded_sums_match_eager_end_to_end(tmp_path, monkeypatch):
    """BatchNorm's statistics, mean over H,W, var_mean and a full sum through the whole kernel
    backend, NCHW and channels last: within float rounding of float64, as eager is."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    from tests.unit.lower.helpers import compile_fn

    def fn(x):
        v, m = torch.var_mean(x, (0, 2, 3))
        return (x.sum(), x.mean((2, 3)), v, m,
                torch.nn.functional.batch_norm(x, None, None, training=True))
    g = torch.Generator().manual_seed(0)
    base = torch.rand(8, 16, 64, 64, generator=g) + 1.0
    for x in (base, base.to(memory_format=torch.channels_last)):
        run, _ = compile_fn(fn, x)
        got, eager, ref = run(x), fn(x), fn(x.double())
        for gt, e, r in zip(got, eager, ref):
            err = float((gt.double() - r).abs().max() / r.abs().max())
            eager_err = float((e.double() - r).abs().max() / r.abs().max())
            assert err <= max(2 * eager_err, 1.2e-7), (err, eager_err)


@pytest.mark.parametrize("to_cl", [True, False])
def test_layout_conversion_is_tiled(tmp_path, monkeypatch, to_cl):
    """NCHW <-> NHWC (conv graphs' input and output conversions): the load strides along the
    store's contiguous dim, so the kernel walks TILE x TILE tiles of (C, H*W); tails (37 channels,
    205 positions) and values match. A same-layout kernel is not tiled."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    shape = (2, 37, 5, 41)
    t = torch.randn(*shape)
    src_t = t if to_cl else t.to(memory_format=torch.channels_last)
    dst = torch.empty(shape, memory_format=torch.channels_last if to_cl else torch.contiguous_format)
    x = InputBuffer("arg0", torch.float32, shape, src_t.stride(), position=0)
    xl = x.loader()
    for out_stride, tiled in ((dst.stride(), True), (src_t.stride(), False)):
        out = ComputedBuffer("buf0", torch.float32, shape, out_stride, body=Pointwise(
            shape, torch.float32, lambda i: ops.add(ops.mul(xl(i), 2.0), 1.0)))
        steps, src, fns, sigs = _compile([out], [x])
        assert ("blk0_lo" in src) == tiled, src
        res = torch.empty_strided(shape, out_stride)
        _run(steps, fns, sigs, {"arg0": src_t, "buf0": res})
        torch.testing.assert_close(res, t * 2 + 1, rtol=0, atol=0)


def _window_max_cl(x, n, w, c, other):
    """Channels-last window max: out[i, j, ch] = max(x[i, j-1, ch], x[i, j, ch]), masked at
    the left edge; the mask moves with j, not with the innermost (simd) dim ch."""
    xl = x.loader()

    def body(i):
        best = None
        for k in range(2):
            col = i[1] - 1 + k
            m = ops.ge(ops.index_expr(col, torch.int32), ops.constant(0, torch.int32))
            v = ops.masked(m, lambda col=col: xl([i[0], col, i[2]]), other)
            best = v if best is None else ops.where(
                ops.logical_or(ops.gt(v, best), ops.isnan(v)), v, best)
        return best
    return ComputedBuffer("buf0", torch.float32, (n, w, c), (w * c, c, 1), body=Pointwise(
        (n, w, c), torch.float32, body))


def test_masked_load_with_invariant_mask_vectorizes(tmp_path, monkeypatch):
    """#24: a load contiguous in the simd dim under a mask that does not move with it (channels-
    last pooling, padding of outer dims) is branch-free: its clamped base and the mask are
    hoisted before the simd loop, the select is ember::pick, and g++ vectorizes the loop (the
    `if` form it replaces never vectorized). Values, NaN and the -inf edge match. (This mask is
    on an outer loop var, which is unswitched when it can be (test_cpp_split.py): here the
    unswitch bound is 1 copy, the form kept beyond the bound.)"""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_ranges, "MAX_UNSWITCH", 1)
    n, w, c = 3, 9, 40
    x = InputBuffer("arg0", torch.float32, (n, w, c), (w * c, c, 1), position=0)
    steps, src, fns, sigs = _compile([_window_max_cl(x, n, w, c, float("-inf"))], [x])
    kernel = src[src.index('extern "C"'):]
    assert "if (" not in kernel and "ember::pick(" in kernel, kernel
    simd_at = kernel.index("#pragma omp simd")
    assert "std::min<int64_t>(std::max<int64_t>(" in kernel[:simd_at], kernel   # hoisted base
    assert ">= static_cast<int32_t>(0)" in kernel[:simd_at], kernel               # hoisted mask
    t = torch.randn(n, w, c)
    t[1, 3, 7] = float("nan")
    t[2, :, 5] = float("-inf")
    res = torch.empty(n, w, c)
    fns[steps[0].name](*[{"arg0": t, "buf0": res}[a].data_ptr() for a in sigs[steps[0].name]])
    pad = torch.nn.functional.pad(t, (0, 0, 1, 0), value=float("-inf"))
    windows = pad.unfold(1, 2, 1)
    exp = torch.where(windows.isnan().any(-1), float("nan"), windows.amax(-1))
    torch.testing.assert_close(res, exp, equal_nan=True)
    # the compiler's own report: the simd loop of this kernel is vectorized
    cpp = tmp_path / "k.cpp"
    cpp.write_text(src)
    first = src[:src.index('extern "C"')].count("\n") + kernel[:simd_at].count("\n") + 1
    report = subprocess.run([CXX, *FLAGS, "-fopt-info-vec-optimized", str(cpp), "-o",
                             str(tmp_path / "k.so")], capture_output=True, text=True).stderr
    lines = [int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)]
    assert any(first <= ln <= src.count("\n") for ln in lines), (first, report)


def test_hoisting_keeps_integer_division_under_its_mask(tmp_path, monkeypatch):
    """An invariant integer division inside a masked body stays under the mask: hoisting it
    before the simd loop would divide by zero where the mask is off (and raise)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    n, w, c = 2, 5, 16
    x = InputBuffer("arg0", torch.int64, (n, w, c), (w * c, c, 1), position=0)
    xl = x.loader()

    def body(i):
        m = ops.ge(ops.index_expr(i[1], torch.int64), ops.constant(1, torch.int64))
        return ops.masked(m, lambda: ops.add(xl(i), ops.floordiv(
            ops.constant(7, torch.int64), ops.index_expr(i[1], torch.int64))), 0)
    out = ComputedBuffer("buf0", torch.int64, (n, w, c), (w * c, c, 1), body=Pointwise(
        (n, w, c), torch.int64, body))
    steps, src, fns, sigs = _compile([out], [x])
    kernel = src[src.index('extern "C"'):]
    assert "ember::ifloordiv" in kernel[kernel.index("#pragma omp simd"):], kernel
    t = torch.randint(-9, 9, (n, w, c))
    res = torch.empty(n, w, c, dtype=torch.int64)
    fns[steps[0].name](*[{"arg0": t, "buf0": res}[a].data_ptr() for a in sigs[steps[0].name]])
    j = torch.arange(w).view(1, w, 1)
    exp = torch.where(j >= 1, t + torch.div(7, j.clamp(min=1), rounding_mode="floor"), 0)
    assert torch.equal(res, exp)


def _gather_kernel(check, per_element):
    """out[i, j] = x[i, idx[...]]: per_element: idx[i, j] (varies along the simd loop), else
    idx[i] (an embedding-like row index, the same along it)."""
    n, d, m = 6, 16, 24
    x = InputBuffer("arg0", torch.float32, (m, d), (d, 1), position=0)
    ishape = (n, d) if per_element else (n,)
    idx = InputBuffer("arg1", torch.int64, ishape, (d, 1) if per_element else (1,), position=1)
    xl, il = x.loader(), idx.loader()

    def body(i):
        if per_element:
            return xl([i[0], ops.indirect_indexing(il(i), d, check)])
        return xl([ops.indirect_indexing(il([i[0]]), m, check), i[1]])
    out = ComputedBuffer("buf0", torch.float32, (n, d), (d, 1), body=Pointwise(
        (n, d), torch.float32, body))
    return _compile([out], [x, idx])


def test_gather_index_checks_raise_index_error_and_keep_loops_vectorizable(tmp_path, monkeypatch):
    # an index outside its dim read outside the buffer; eager raises IndexError. Checked
    # per lane (an OR reduction on the simd loop, no branch: the gather still vectorizes) or once
    # before the loop when the index is the same along it; unchecked for _unsafe_index
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    x = torch.randn(24, 16)
    for per_element in (True, False):
        size = 16 if per_element else 24
        idx = torch.randint(-size, size, (6, 16) if per_element else (6,))
        ref = x.gather(1, idx % size) if per_element else x[idx]
        for check in (True, False):
            _, src, fns, sigs = _gather_kernel(check, per_element)
            out = torch.empty(6, 16)

            def run(i):
                ptrs = {"arg0": x, "arg1": i, "buf0": out}
                fns["kernel0"](*[ptrs[a].data_ptr() for a in sigs["kernel0"]])
            run(idx)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
            if not check:
                assert "ember::bound(" not in src and "ember::flag_index_oob()" not in src
                continue
            if per_element:
                assert re.search(r"#pragma omp simd reduction\(\|:oob\d+\)", src), src
                # checked on the int64 value, then wrapped and clamped as int32: a select of
                # the int64 index on the check (`out ? 0 : w`) made g++ 12 emit a scalar loop
                assert re.search(r"int32_t idx\d+_t = static_cast<int32_t>", src), src
                assert not re.search(r"\? 0 :", src), src
            else:
                assert re.search(r"const int(?:32|64)_t idx\d+ = ember::bound\(.*\n\s*#pragma omp simd",
                                 src), src
            # just past either end; 2^32 (+ k) narrows to an in-range int32 but is out of
            # range; the int64 extremes (the unsigned check must not overflow)
            for v in (size, -size - 1, 2 ** 32, 2 ** 32 + 3, -2 ** 32, 2 ** 63 - 1, -2 ** 63):
                bad = idx.clone()
                bad.view(-1)[5] = v
                with pytest.raises(IndexError, match="out of bounds"):
                    run(bad)
                run(idx)                                  # the flag was reset
                torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("cols", [300, 2000])
def test_column_sums_walk_whole_rows(tmp_path, monkeypatch, cols):
    """A sum down the columns of a row-major [rows, cols] matrix (a LayerNorm weight or a
    linear bias gradient) takes blocks as wide as its accumulators fit 16 zmm (256 float
    columns, design 082; at most the row), split between the threads at run time: each row
    is a 1 KB contiguous run, not 256-byte pieces a row stride apart. 300 columns: a 256-wide
    block and a 44-wide remainder; 2000: 256-wide blocks. Values within float rounding of
    float64 at 1 and 2 threads."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    rows = 5000
    x = InputBuffer("arg0", torch.float32, (rows, cols), (cols, 1), position=0)
    xl = x.loader()
    s = ComputedBuffer("buf0", torch.float32, (cols,), (1,), body=Reduction(
        (cols,), (rows,), "sum", torch.float32, torch.float32, lambda i, r: xl([r[0], i[0]])))
    steps, src, fns, sigs = _compile([s], [x])
    assert "omp_get_max_threads()" in src and "acc0_b[256]" in src and "[1024]" not in src, src
    t = torch.rand(rows, cols) + 0.5
    ref = t.double().sum(0)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            res = torch.empty(cols)
            _run(steps, fns, sigs, {"arg0": t, "buf0": res})
            assert float(((res.double() - ref) / ref).abs().max()) < 2e-7
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("squares", [False, True])
def test_column_sums_keep_blocks_in_registers(tmp_path, monkeypatch, squares, dtype):
    """A column sum takes blocks whose accumulators fit ACC_BYTES (16 zmm), not the row's 2000
    columns (a store-bound update of memory every row, 1.5-2.5x slower on Zen 4): in double
    (float64 data, BatchNorm's double statistics) 128 columns for one sum, 64 for a sum and a
    sum of squares; in float 256 and 128 (design 082). Values vs a float64 reference at 1 and
    2 threads (double: within its rounding; float: 300 rows of [0.5, 1.5))."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    rows, cols = 300, 2000
    x = InputBuffer("arg0", dtype, (rows, cols), (cols, 1), position=0)
    xl = x.loader()
    nodes = [ComputedBuffer("buf0", dtype, (cols,), (1,), body=Reduction(
        (cols,), (rows,), "sum", dtype, dtype, lambda i, r: xl([r[0], i[0]])))]
    if squares:
        nodes.append(ComputedBuffer("buf1", dtype, (cols,), (1,), body=Reduction(
            (cols,), (rows,), "sum", dtype, dtype,
            lambda i, r: ops.mul(xl([r[0], i[0]]), xl([r[0], i[0]])))))
    steps, src, fns, sigs = _compile(nodes, [x])
    width = (64 if squares else 128) * (8 // dtype.itemsize)
    assert f"{'double' if dtype == torch.float64 else 'float'} acc0[{width}];" in src \
        and "[2000]" not in src, src
    t = torch.rand(rows, cols, dtype=torch.float64) + 0.5
    refs = [t.sum(0), (t * t).sum(0)][:len(nodes)]
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            bufs = {"arg0": t.to(dtype), **{nd.name: torch.empty(cols, dtype=dtype) for nd in nodes}}
            for st in steps:
                fns[st.name](*[bufs[a].data_ptr() for a in sigs[st.name]])
            for nd, ref in zip(nodes, refs):
                torch.testing.assert_close(bufs[nd.name].double(), ref, atol=0,
                                           rtol=1e-13 if dtype == torch.float64 else 2e-5)
    finally:
        torch.set_num_threads(threads)
