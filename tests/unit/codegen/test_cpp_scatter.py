"""Scatters whose index has the output's size in every dim but the scattered one (gather's
backward, scatter_add of a loss's gradient) as C++ kernels (codegen/cpp_scatter.py, docs/design/
066): rows in parallel, each row's sources added in index order, so float32/float64 results
equal eager's bit for bit; the zero fill / base copy and the source's producers are in the
kernel. An index outside [0, n) raises IndexError like eager (negative ones too)."""
import re

import pytest
import torch

import ember
from ember.aot import trace_aten
from ember.backends.ember import compile_aten_graph
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


def _index(shape, dim, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, shape, generator=g)


# (x shape, dim, index size along dim): every dim, negative dims, size-1 dims, a 1-d scatter
CASES = [((6, 9, 5), 0, 13), ((6, 9, 5), 1, 20), ((6, 9, 5), 2, 11), ((6, 9, 5), -1, 3),
         ((6, 9, 5), -3, 2), ((4, 1, 7), 2, 30), ((300,), 0, 1000), ((2, 3, 4, 5), 2, 9),
         ((3, 5), 1, 0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,dim,count", CASES)
def test_scatter_add_equals_eager_bit_for_bit(shape, dim, count, dtype):
    d = dim % len(shape)
    ishape = (*shape[:d], count, *shape[d + 1:])
    x = torch.randn(*shape, dtype=dtype)
    src = torch.randn(*ishape[:d], count + 2, *ishape[d + 1:], dtype=dtype) * 3
    idx = _index(ishape, d, shape[d])       # repeated positions: several adds per element

    def fn(a, i, s):
        return torch.zeros_like(a).scatter_add(dim, i, s * 2), a.scatter_add(dim, i, s) - 1
    run, stats = compile_fn(fn, x, idx, src)
    got = run(x, idx, src)
    for g, r in zip(got, fn(x, idx, src)):
        assert torch.equal(g, r), (g - r).abs().max()
    assert stats["externs"] == 0 and not stats["fallbacks"], stats


def test_scatter_assign_with_repeated_indices_keeps_eagers_last_write():
    x, s = torch.randn(8, 30), torch.randn(8, 50)
    idx = _index((8, 50), 1, 30)
    run, stats = compile_fn(lambda a, i, t: (a.scatter(1, i, t), a.scatter(1, i, 2.5)), x, idx, s)
    for g, r in zip(run(x, idx, s), (x.scatter(1, idx, s), x.scatter(1, idx, 2.5))):
        assert torch.equal(g, r)
    assert stats["externs"] == 0, stats


def test_non_contiguous_operands():
    """A transposed base, a transposed source (the p2c gather of DeBERTa's backward) and an
    expanded index (stride 0)."""
    x = torch.randn(7, 6).t()
    s = torch.randn(12, 6).t()
    idx = _index((1, 12), 1, 7).expand(6, 12)
    fn = (lambda a, i, t: a.scatter_add(1, i, t * 0.5))
    run, stats = compile_fn(fn, x, idx, s)
    assert torch.equal(run(x, idx, s)[0], fn(x, idx, s))
    assert stats["externs"] == 0, stats


@pytest.mark.parametrize("rows,count", [(16, 40), (100, 5000)])
def test_expanded_index_over_dim0_equals_eagers_sorted_path(rows, count):
    """An index expanded over the inner dims (index_add-like, dim 0): eager takes its
    expanded-index path (sorts the index, adds per destination row); the sums are still in
    index order for each element, so ours equal them bit for bit."""
    x, s = torch.randn(rows, 32), torch.randn(count, 32)
    idx = _index((count, 1), 0, rows).expand(count, 32)
    fn = (lambda a, i, t: a.scatter_add(0, i, t))
    run, stats = compile_fn(fn, x, idx, s)
    assert torch.equal(run(x, idx, s)[0], fn(x, idx, s))
    assert stats["externs"] == 0, stats


def test_empty_output_and_empty_index():
    """0-size output: the extern (nothing to generate); an index of size 0 at dim: the copy."""
    fn = (lambda a, i, t: a.scatter_add(1, i, t) + 1)
    for x, idx in ((torch.randn(0, 5), torch.zeros(0, 3, dtype=torch.long)),
                   (torch.randn(4, 5), torch.zeros(4, 0, dtype=torch.long))):
        s = torch.randn(idx.shape[0], 3)
        run, _ = compile_fn(fn, x, idx, s)
        assert torch.equal(run(x, idx, s)[0], fn(x, idx, s))


@pytest.mark.parametrize("bad", [9, -1, -10])
def test_index_outside_the_dim_raises_like_eager(bad):
    x, s = torch.randn(4, 9), torch.randn(4, 6)
    idx = _index((4, 6), 1, 9)
    run, _ = compile_fn(lambda a, i, t: a.scatter_add(1, i, t), x, idx, s)
    idx[2, 3] = bad
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.scatter_add(1, idx, s)
    with pytest.raises(IndexError):     # ember's kernels flag it; the wrapper raises this
        run(x, idx, s)


@pytest.mark.parametrize("shape,dim", [((8, 12, 16, 16), -1), ((8, 12, 16, 24), 2),
                                       ((5, 40, 3), 0)])
def test_gather_backward_equals_eager(shape, dim):
    """gather's backward is zeros.scatter_add(dim, index, grad): one kernel, no aten call; the
    gradient is eager's bit for bit."""
    torch.manual_seed(0)
    d = dim % len(shape)
    ishape = list(shape)
    ishape[d] = shape[d] + 5
    x = torch.randn(*shape, requires_grad=True)
    idx = _index(tuple(ishape), d, shape[d])
    g = torch.randn(*ishape)

    def f(t, i):
        return torch.gather(t * 1.5, dim, i)
    c = ember.compile(f, fullgraph=True, options={"speed_check": False})
    c(x, idx).backward(g)
    gx, x.grad = x.grad, None
    f(x, idx).backward(g)
    assert torch.equal(gx, x.grad), (gx - x.grad).abs().max()


def test_take_along_dim_and_topk_backward():
    torch.manual_seed(0)
    x = torch.randn(6, 40, requires_grad=True)
    g = torch.randn(6, 5)

    def f(t):
        v, i = torch.topk(t, 5, -1)
        return v * 2 + torch.take_along_dim(t, i, -1)
    c = ember.compile(f, fullgraph=True, options={"speed_check": False})
    c(x).backward(g)
    gx, x.grad = x.grad, None
    f(x).backward(g)
    torch.testing.assert_close(gx, x.grad, rtol=0, atol=0)


def test_scatter_kernel_zero_fills_each_row_then_adds_in_index_order():
    """The generated kernel: parallel over the rows, the zero fill a simd loop, the index row
    walked in order with the bounds check, the source's producer (`* 2`) inline."""
    x, s = torch.randn(128, 128), torch.randn(128, 200)
    idx = _index((128, 200), 1, 128)
    src = _src(lambda a, i, t: torch.zeros_like(a).scatter_add(1, i, t * 2), x, idx, s)
    assert "scatter" not in src and src.count('extern "C" void kernel') == 1, src
    assert re.search(r"#pragma omp parallel for\s+for \(int64_t v0 = 0; v0 < 128; \+\+v0\)", src)
    assert re.search(r"#pragma omp simd\s+for \(int64_t v1 = 0; v1 < 128; \+\+v1\)\s*\{\s*"
                     r"\w+\[\(v1 \+ \(128 \* v0\)\)\] = 0\.0f;", src), src
    assert re.search(r"for \(int64_t (v\d+) = 0; \1 < 200; \+\+\1\)", src), src
    assert "if (static_cast<uint64_t>(j" in src and ">= 128u) { ember::flag_index_oob(); continue; }" in src
    assert re.search(r"\w+\[\(j\d+ \+ \(128 \* v0\)\)\] \+= tmp\d+;", src), src
    assert "* 2.0f" in src


def test_outer_dim_scatter_runs_chunks_of_the_inner_dim_in_parallel():
    """Scatter along dim 0 ([16, 4096]): no row before the scattered dim, so chunks of the
    inner dim are the parallel tasks; each chunk walks the whole index column in order."""
    x, s = torch.randn(16, 4096), torch.randn(40, 4096)
    idx = _index((40, 4096), 0, 16)
    fn = (lambda a, i, t: a.scatter_add(0, i, t))
    src = _src(fn, x, idx, s)
    assert re.search(r"#pragma omp parallel for\s+for \(int64_t v2 = 0; v2 < 64; \+\+v2\)", src), src
    run, _ = compile_fn(fn, x, idx, s)
    assert torch.equal(run(x, idx, s)[0], fn(x, idx, s))


def test_16_bit_and_integer_scatter_add_stay_aten():
    """bf16/fp16 and integer scatter_adds are aten externs (not claimed bit-equal here)."""
    for dtype in (torch.bfloat16, torch.float16, torch.int64):
        x = (torch.randn(4, 9) * 5).to(dtype)
        idx = _index((4, 6), 1, 9)
        run, stats = compile_fn(lambda a, i: a.scatter_add(1, i, a[:, :6]), x, idx)
        assert torch.equal(run(x, idx)[0], x.scatter_add(1, idx, x[:, :6]))
        assert stats["externs"] == 1, (dtype, stats)


def test_in_place_scatter_add_of_an_input():
    """x.scatter_add_(..., x-derived source): the new value of the caller's x."""
    x = torch.randn(5, 8)
    idx = _index((5, 8), 1, 8)
    want = x.clone()
    want.scatter_add_(1, idx, want * 1.0)

    def f(a, i):
        a.scatter_add_(1, i, a)
        return a + 1
    c = ember.compile(f, fullgraph=True, options={"speed_check": False})
    got = x.clone()
    out = c(got, idx)
    assert torch.equal(got, want), (got - want).abs().max()
    assert torch.equal(out, want + 1)


def test_symbolic_source_size_stays_an_extern():
    """Recompiles (a gather's grad compiled between) marked the source's dims dynamic while x
    (a constant shape) and the expanded index stayed static: the size checks must not compare
    a symbol (they raised TypeError in lower)."""
    for shape in ((2, 3, 4, 4), (2, 3, 6, 5), (7, 4, 6)):
        idx = _index((shape[-2], 4), 1, shape[-1]).expand(*shape[:-1], 4)
        x, g = torch.randn(*shape, requires_grad=True), torch.randn(idx.shape)
        fns = [lambda gr, i: torch.zeros(shape).scatter_add(-1, i, gr),
               lambda t, i: torch.autograd.grad(torch.gather(t * 1.5, -1, i), t, g)[0]]
        for fn, arg in zip(fns, (g, x)):
            assert torch.equal(ember.compile(fn)(arg, idx), fn(arg, idx))


def test_triton_lowering_keeps_the_aten_scatter():
    """Triton kernels have no Scatter form: GraphLowering(cpp=False) keeps the extern."""
    x, s = torch.randn(4, 9), torch.randn(4, 6)
    idx = _index((4, 6), 1, 9)
    gm = trace_aten(lambda a, i, t: a.scatter_add(1, i, t), (x, idx, s),
                    decompositions=get_decompositions())
    for cpp, want in ((False, ["scatter_add.default"]), (True, [])):
        nodes = GraphLowering(gm, [x, idx, s], cpp=cpp).run().nodes
        assert [str(n.op).split("aten.")[-1] for n in nodes if n.kind == "extern"] == want
    run = compile_aten_graph(gm, [x, idx, s], options={"cpu_codegen": "triton"})
    assert torch.equal(run(x, idx, s)[0], x.scatter_add(1, idx, s))


def test_printed_ir_names_the_scatter():
    from ember.loopir.printer import print_lowered
    x, s = torch.randn(4, 9), torch.randn(4, 6)
    idx = _index((4, 6), 1, 9)
    gm = trace_aten(lambda a, i, t: a.scatter_add(1, i, t), (x, idx, s),
                    decompositions=get_decompositions())
    low = GraphLowering(gm, [x, idx, s]).run()
    text = print_lowered(low.inputs, low.nodes, low.outputs)
    assert "# scatter_add along dim 1 of 6 per row (reads at scatter_k < 6)" in text, text
