"""C++ codegen on small hand-built loop IR: loop planning, pragmas, tails and dtypes."""
import sympy
import torch

from ember.loopir.index import FloorDiv, ModularIndexing, sym
from ember.loopir.ops import ops
from ember.codegen.cpp import cexpr, generate_tu, plan_loops
from ember.loopir.nodes import ComputedBuffer, InputBuffer, Pointwise, Reduction
from ember.runtime.build import build, load
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
    selects: no `if`, vectorizable; a contiguous one keeps the `if` (a masked vector load).
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
        assert ("if (" in kernel) == (step == 1), kernel
        assert ("std::min<int32_t>" in kernel) == (step == 2), kernel
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


def test_long_float_sums_accumulate_in_double(tmp_path, monkeypatch):
    # BatchNorm statistics: 100k elements per channel, along rows (NCHW) and down columns (NHWC).
    # A float accumulator drifts by ~sqrt(n) ulps (1e-5 relative here, 20x eager's error on
    # lraspp's activations); a double one stays at float's rounding of the result
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
        assert "double acc" in src
        res = torch.empty(c)
        fns[steps[0].name](*[{inp.name: arg, "buf0": res}[a].data_ptr()
                             for a in sigs[steps[0].name]])
        ref = t.double().sum(1)
        assert float(((res.double() - ref) / ref).abs().max()) < 2e-7
