"""Loops split where index compares change value (cpp_ranges): a cat, pad or chunk backward
along the contiguous dim becomes one simd loop per segment with its masks decided, so each
element computes only its own input's body (no `if`, no select between bodies)."""
import re

import pytest
import torch
import torch.nn.functional as F

import ember
from tests.unit.lower.helpers import check_grads


def _kernels(tmp_path, pattern="*kernels.cpp"):
    src = "\n".join(p.read_text() for p in sorted((tmp_path / "debug").rglob(pattern)))
    return "\n".join(part[part.index('extern "C" void kernel'):]
                     for part in src.split("// after kernels") if 'extern "C" void kernel' in part)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_cat_last_dim_one_body_per_segment(dirs):
    a, b = torch.randn(6, 40), torch.randn(6, 24)

    def f(x, y):
        return torch.cat([x.sigmoid(), (y * 3).exp()], -1)
    got = ember.compile(f, options={"speed_check": False})(a, b)
    torch.testing.assert_close(got, f(a, b))
    k = _kernels(dirs)
    assert "if (" not in k and "pick(" not in k, k
    assert k.count("ember::sigmoid(") == 1 and k.count("ember::exp(") == 1, k
    assert "v1 = 40; v1 < 64" in k, k


@pytest.mark.parametrize("pad", [(1, 2), (3, 0), (0, 5), (-1, 2)])
def test_constant_pad_last_dim(dirs, pad):
    x = torch.randn(3, 7, 33)
    x[0, 0, 0] = float("nan")

    def f(t):
        return F.pad(t.tanh(), pad, value=-2.5) * 2
    got = ember.compile(f, options={"speed_check": False})(x)
    torch.testing.assert_close(got, f(x), equal_nan=True)
    assert "if (" not in _kernels(dirs)


def test_equality_compare_splits_out_one_column(dirs):
    x = torch.randn(5, 50)

    def f(t):
        col = torch.arange(50)
        return torch.where(col == 7, t.exp(), t * 0.5) + torch.where(col < 45, 1.0, -1.0)
    got = ember.compile(f, options={"speed_check": False})(x)
    torch.testing.assert_close(got, f(x))
    k = _kernels(dirs)
    assert "v1 = 7; v1 < 8" in k and "v1 = 45; v1 < 50" in k, k


def test_chunk_backward_swiglu_grads(dirs):
    # chunk's backward is a cat of the two halves' gradients along the last dim
    x = torch.randn(4, 9, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    g = torch.randn(4, 9, 32)

    def f(t):
        a, b = t.chunk(2, -1)
        return F.silu(a) * b
    (ref,) = torch.autograd.grad(f(x), x, g)
    (got,) = torch.autograd.grad(ember.compile(f, options={"speed_check": False})(x2), x2, g)
    torch.testing.assert_close(got, ref)
    k = _kernels(dirs, "*backward_kernels.cpp")
    assert "if (" not in k and k.count("ember::sigmoid(") == 2, k


# --- outer loops (unswitching): compares on a var the simd loop does not move -----------------

def _simd_loops(k):
    """The bodies of the kernel's `omp simd` loops (each up to its closing brace)."""
    out = []
    for part in k.split("#pragma omp")[1:]:
        if "simd" not in part.split("\n", 1)[0]:
            continue
        body = part[part.index("{") + 1:]
        depth, end = 1, 0
        for end, ch in enumerate(body):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                break
        out.append(body[:end])
    return out


def _loads(body):
    import re
    return re.findall(r"\barg\d+\[", body)


@pytest.mark.parametrize("parts", [2, 4, 8])
def test_channel_cat_simd_loop_loads_one_input(dirs, parts):
    # cat along C of NCHW: before, one simd loop (over H*W) loaded all `parts` inputs per
    # element and picked one; unswitched, each channel range has its own nest with one load
    xs = [torch.randn(2, 3 + i % 2, 5, 7) for i in range(parts)]

    def f(*t):
        return torch.cat(t, 1).relu()
    got = ember.compile(f, options={"speed_check": False})(*xs)
    assert torch.equal(got, f(*xs))
    loops = _simd_loops(_kernels(dirs))
    assert len(loops) == parts and all(len(_loads(b)) == 1 for b in loops), loops
    assert "pick(" not in "".join(loops) and "if (" not in "".join(loops)


def test_pad_on_h_rows_outside_are_constant(dirs):
    x = torch.randn(2, 3, 9, 11)
    x[0, 1, 2, 3] = float("nan")

    def f(t):
        return F.pad(t, (0, 0, 2, 3), value=-1.5).relu() + 0.5
    got = ember.compile(f, options={"speed_check": False})(x)
    torch.testing.assert_close(got, f(x), equal_nan=True, rtol=0, atol=0)
    loops = _simd_loops(_kernels(dirs))
    assert len(loops) == 3 and sorted(len(_loads(b)) for b in loops) == [0, 0, 1], loops
    assert all("pick(" not in b and "if (" not in b for b in loops), loops


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_stack_of_8_one_load_per_simd_loop(dirs, dim):
    xs = [torch.randn(4, 6, 40) for _ in range(8)]

    def f(*t):
        return torch.stack(t, dim) * 2 - 1
    got = ember.compile(f, options={"speed_check": False})(*xs)
    assert torch.equal(got, f(*xs))
    loops = _simd_loops(_kernels(dirs))
    assert loops and all(len(_loads(b)) == 1 for b in loops), loops


def test_row_kernel_over_a_cat_of_rows(dirs):
    # softmax over the last dim of a cat along dim 1 (ViT's cls token + patches, then a norm):
    # the row kernel's loops are unswitched on the row var, each copy reads one input
    a, b = torch.randn(2, 3, 40), torch.randn(2, 5, 40)
    a[1, 2, 7] = float("nan")

    def f(x, y):
        return torch.cat([x, y * 2], 1).softmax(-1)
    got = ember.compile(f, options={"speed_check": False})(a, b)
    torch.testing.assert_close(got, f(a, b), equal_nan=True)
    loops = _simd_loops(_kernels(dirs))
    assert [len(_loads(b)) for b in loops] == [1, 0, 0, 1, 0, 0], loops


def test_big_channel_cat_copies_stay_parallel(dirs):
    xs = [torch.randn(8, 16, 28, 28) for _ in range(4)]

    def f(*t):
        return torch.cat(t, 1).sigmoid()
    got = ember.compile(f, options={"speed_check": False})(*xs)
    torch.testing.assert_close(got, f(*xs), rtol=1e-6, atol=1e-7)
    k = _kernels(dirs)
    assert k.count("#pragma omp parallel for") == 4 and k.count("ember::sigmoid(") == 4, k


def _scan_tree(a, b):
    """Two levels of a parallel scan's down-sweep over dim 1 of [B, T, D] (Mamba's scan as
    ember rewrites it): cats of shifted slices, combined with exp/mul; the selects are on the
    outer dims (T and its halves), the simd loop runs over D."""
    even, odd = a[:, 0::2], a[:, 1::2]
    be, bo = b[:, 0::2], b[:, 1::2]
    s1 = torch.cat([be[:, :1], be[:, 1:] + even[:, 1:].exp() * bo[:, :-1]], 1)
    s2 = torch.stack([s1, bo + odd.exp() * s1], 2).flatten(1, 2)
    return torch.cat([s2[:, :1] * 0.5, s2[:, 1:-1], s2[:, -1:] * 2], 1)


def test_scan_style_cat_tree_values_and_grads(dirs):
    a = torch.randn(2, 16, 24, requires_grad=True)
    b = torch.randn(2, 16, 24, requires_grad=True)
    a2, b2 = (t.detach().clone().requires_grad_(True) for t in (a, b))
    g = torch.randn(2, 16, 24)
    ref = _scan_tree(a, b)
    got = ember.compile(_scan_tree, options={"speed_check": False})(a2, b2)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(got, (a2, b2), g),
                               torch.autograd.grad(ref, (a, b), g), rtol=1e-5, atol=1e-6)
    # the forward's cat tree is unswitched completely; the backward stores the stacked value
    # behind s2's multi-use reshape (lowering.maybe_realize), and its slice gradients' zero pads
    # fuse into one kernel that keeps selects: at [8, 1024, 256] fwd+bwd that is as fast as
    # unswitched copies were (thread CPU, eager/ember 1.87-1.95 vs 1.77-1.82 before)
    k = _kernels(dirs, "*[0-9]_kernels.cpp")
    assert k and "pick(" not in k and "if (" not in k, k


def test_unswitched_copies_keep_no_dead_branch_temporaries(dirs):
    # each copy of an unswitched nest computed the clamped offsets and compares of every
    # branch, also those decided false there (HF Mamba's scan kernels: ~30% of the C++); they
    # are pruned, the copies' values unchanged (scan tree: values and grads as above)
    xs = [torch.randn(2, 3 + i % 2, 5, 7) for i in range(4)]

    def f(*t):
        return torch.cat(t, 1).relu()
    assert torch.equal(ember.compile(f, options={"speed_check": False})(*xs), f(*xs))
    k = _kernels(dirs)
    assert "std::max<int64_t>" not in k, k            # the other parts' clamped offsets
    a, b = torch.randn(2, 16, 24), torch.randn(2, 16, 24)
    torch.testing.assert_close(ember.compile(_scan_tree, options={"speed_check": False})(a, b),
                               _scan_tree(a, b), rtol=1e-6, atol=1e-6)
    import re
    for kernel in _kernels(dirs).split('extern "C"')[1:]:
        for name in set(re.findall(r"\b(?:tmp|idx)\d+\b", kernel)):
            assert len(re.findall(rf"\b{name}\b", kernel)) > 1, (name, kernel)


def test_prune_dead_keeps_what_is_read_checked_or_assigned():
    from ember.codegen.cpp_handler import prune_dead
    lines = ["    int64_t tmp0 = static_cast<int64_t>(v1);",        # read only by tmp1: dead
             "    bool tmp1 = (tmp0 >= static_cast<int64_t>(3));",  # read by nothing: dead
             "    const int32_t idx2 = ember::bound(v1 - 2, 5);",   # unread, but flags
             "    float tmp3 = 0.0f;",                               # assigned in the `if`
             "    if (v1 > 2) {",
             "        tmp3 = 1.0f;",
             "    }",
             "    float tmp4 = arg0[v1];",
             "    buf0[v1] = tmp4;"]
    assert prune_dead(lines) == lines[2:]


def test_symbolic_sizes_keep_one_nest(dirs):
    def f(x, y):
        return torch.cat([x, y], 1).relu()
    cf = ember.compile(f, dynamic=True, options={"speed_check": False})
    for n in (3, 5):
        xs = (torch.randn(n, 2, 10), torch.randn(n, 3, 10))
        assert torch.equal(cf(*xs), f(*xs))


def test_one_dim_split_loop_can_be_parallel(dirs):
    # the innermost split of a 1-D kernel big enough to be parallel (a Span as the parallel
    # loop: its collapse hint crashed)
    x = torch.randn(100000)

    def f(t):
        return F.pad(t, (3, 5)).relu()
    assert torch.equal(ember.compile(f, options={"speed_check": False})(x), f(x))
    assert "#pragma omp parallel for simd" in _kernels(dirs)


def test_unswitch_bound():
    import sympy
    from ember.codegen import cpp_ranges
    from ember.loopir.ops import ops
    vs = sympy.symbols("v0 v1 v2", integer=True, nonnegative=True)
    sizes = dict(zip(vs, (10, 12, 9)))

    def body():         # 3, 5 and 2 segments on v0, v1, v2
        ops.lt(ops.index_expr(vs[0], torch.int64), ops.constant(4, torch.int64))
        ops.lt(ops.index_expr(vs[0] * 2, torch.int64), ops.constant(15, torch.int64))
        for k in (2, 4, 6, 8):
            ops.ge(ops.index_expr(vs[1], torch.int64), ops.constant(k, torch.int64))
        ops.eq(ops.index_expr(-vs[2] + 3, torch.int64), ops.constant(3, torch.int64))
    combos = cpp_ranges.unswitch(body, sizes, sizes, {})
    # fewest segments first while the product stays <= 16: v2 (2), v0 (3); v1 (5) would be 30
    assert len(combos) == 6 and all(set(c) == {vs[0], vs[2]} for c in combos), combos
    assert sorted({c[vs[0]] for c in combos}) == [(0, 4), (4, 8), (8, 10)]
    assert sorted({c[vs[2]] for c in combos}) == [(0, 1), (1, 9)]


def test_div_mod_of_a_short_var_split_into_values_and_folded():
    import sympy
    from ember.codegen import cpp_ranges
    from ember.loopir.index import FloorDiv, ModularIndexing
    from ember.loopir.ops import ops
    v = sympy.Symbol("v0", integer=True, nonnegative=True)

    def body():
        ops.ge(ops.index_expr(ModularIndexing(v, 1, 2), torch.int64), ops.constant(1, torch.int64))
    assert cpp_ranges.unswitch(body, {v: 4}, {v: 4}, {}) == [{v: (i, i + 1)} for i in range(4)]
    assert cpp_ranges.unswitch(body, {v: 9}, {v: 9}, {}) is None      # longer: keeps the select
    # in a one-value segment a div or mod of the var is a number, unless its argument is
    # negative there (C++ truncates where sympy floors: left undecided)
    assert cpp_ranges.bounds(FloorDiv(v, 2) - 1, {v: 4}, {v: (3, 4)}) == (0, 0)
    assert cpp_ranges.bounds(ModularIndexing(v - 1, 1, 2), {v: 4}, {v: (0, 1)}) is None
    assert cpp_ranges.bounds(FloorDiv(v, 2), {v: 4}, {v: (1, 3)}) is None


def _cat_of_transposed(x, y, g):
    """A channel cat of a transposed [B, L, C] part (a layout conversion: tiled) and a plain
    one, times a gate: a cat in a conv1d's input gradient (Mamba2's x, B, C)."""
    return torch.cat([x.transpose(1, 2), y], 1) * torch.sigmoid(g)


def test_tiled_channel_cat_decides_its_compares(dirs):
    # the tile loops decided no compare: every simd loop loaded both parts, masked, and picked
    # one; each part now has its own nest (tiled where its load is transposed)
    check_grads(_cat_of_transposed, torch.randn(2, 96, 40), torch.randn(2, 24, 96),
                torch.randn(2, 64, 96))
    loops = _simd_loops(_kernels(dirs, "*_kernels.cpp"))
    assert loops and not any("pick(" in b or "if (" in b for b in loops), loops
    assert "blk0_lo" in _kernels(dirs, "*_kernels.cpp")     # the transposed part is tiled



@pytest.mark.parametrize("mode", ["reflect", "replicate", "constant"])
def test_pad_of_many_planes_walks_each_plane_once(dirs, mode):
    """A pad along H and W of [N, C, H, W] with N*C >= SHARED_OUTER_MIN planes: one parallel
    loop over the planes around the H segments (each plane's top, middle and bottom rows in
    turn), not one sweep over all planes per H segment. Fewer planes keep a nest per
    segment (too little outer work for the threads): 5 planes here. Values exact against eager."""
    for shape, nests in (((4, 32, 9, 11), 1), ((1, 5, 9, 11), 3)):
        x = torch.randn(shape)

        def f(t):
            return F.pad(t, (3, 2, 2, 3), mode=mode) * 2
        got = ember.compile(f, options={"speed_check": False})(x)
        torch.testing.assert_close(got, f(x), rtol=0, atol=0)
        k = _kernels(dirs)
        planes = shape[0] * shape[1]
        assert len(re.findall(rf"for \(int64_t (v\d) = 0; \1 < {planes}; ", k)) == nests, k
        for p in (dirs / "debug").rglob("*"):
            if p.is_file():
                p.unlink()
        ember.reset()


@pytest.mark.parametrize("parts, loops", [(16, 4), (8, 2), (4, 1)])
def test_many_stream_pointwise_loop_splits_between_outputs(dirs, parts, loops):
    """A cat's backward writes one gradient slice per part from relu's saved output and the
    incoming gradient: 3 streams a part. Over FISSION_STREAMS (12) streams the one simd loop is
    split between the parts into loops of about 12 streams each (16 parts: 4 loops, 8: 2); 4
    parts stay one loop. Gradients exact against eager; the in-place forward relu too."""
    xs = [torch.randn(2, 4, 9, 10) for _ in range(parts)]

    def f(*ts):
        return torch.cat(ts, 1).relu()
    leaves = [x.clone().requires_grad_(True) for x in xs]
    ref = f(*leaves)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, leaves, g)
    mine = [x.clone().requires_grad_(True) for x in xs]
    out = ember.compile(f, options={"speed_check": False})(*mine)
    torch.testing.assert_close(out, ref.detach(), rtol=0, atol=0)
    for w, got in zip(want, torch.autograd.grad(out, mine, g)):
        torch.testing.assert_close(got, w, rtol=0, atol=0)
    bwd = _kernels(dirs, "*backward_kernels.cpp")
    assert bwd.count("#pragma omp simd") == loops, bwd
    assert len(re.findall(r"\bbuf\d+\[.*\] = tmp\d+;", bwd)) == parts, bwd    # each slice once
