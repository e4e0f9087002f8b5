"""Symbolic graphs from Dynamo (dynamic=True): aot maps Dynamo's size symbols to ember's shape
env (aot/foreign.py) instead of refusing them; ember's own size guards are checked per call."""
import pytest
import torch

import ember
from ember.backends.ember import STATS


def _run(fn, inputs_list):
    torch._dynamo.reset()
    STATS.clear()
    compiled = torch.compile(fn, backend=ember.backend, dynamic=True)
    for args in inputs_list:
        got, ref = compiled(*args), fn(*args)
        for g, r in zip(got if isinstance(got, tuple) else (got,),
                        ref if isinstance(ref, tuple) else (ref,)):
            assert type(g) is type(r)
            torch.testing.assert_close(g, r)
    return len(STATS)


def test_one_symbolic_graph_serves_several_sizes():
    def f(x, y):
        return (x * 2).sum(0) + y[: x.shape[1]]
    n = _run(f, [(torch.randn(4, k), torch.randn(k + 3)) for k in (5, 7, 9, 11)])
    assert n == 1          # compiled once, symbolically


def test_size_output_is_this_calls_int():
    # Inductor's test_scalar_output: the SymInt output came back as a SymInt
    def f(a, b):
        k = b.size(1)
        return torch.ops.aten.full.default([1, k], 1, dtype=torch.float32), k, a[b.view(-1, k)]
    _run(f, [(torch.randn(10, 4), torch.randint(10, (1, k))) for k in (6, 8)])


def test_ember_guard_failure_compiles_another_variant():
    # a size 1 specializes in ember's env (not in Dynamo's guards): checked, not reused wrongly
    def f(x):
        return torch.nn.functional.softmax(x, -1) * x.shape[0]
    _run(f, [(torch.randn(k, 6),) for k in (5, 1, 7, 2)])


def test_round_of_symfloat_keeps_digits():
    # shapes.SymNode.round dropped ndigits (round(i / 2 * 123.4567, 1) became 123.0)
    def f(x, i):
        return x + round(i / 2 * 123.4567, 1)
    _run(f, [(torch.zeros(2), i) for i in (2, 3, 7)])


def test_backward_binds_a_size_seen_only_as_s_minus_1():
    """A backward whose one input is the tangent of `a[..., :-1, :]` ([1, s0, s1 - 1, s2]): the
    wrapper binds s1 from that dim (it refused: "s1 is no input's dimension"; Inductor's
    test_dtype_sympy_expr)."""
    def fn(a):
        return a[..., :-1, :].contiguous() * 2

    cf = torch.compile(fn, backend=ember.backend, dynamic=True, fullgraph=True)
    for n in (16, 9):
        a = torch.randn([1, 2, n, 4], requires_grad=True)
        g = torch.randn([1, 2, n - 1, 4])
        out = cf(a)
        (grad,) = torch.autograd.grad(out, a, g)
        torch.testing.assert_close(out, fn(a))
        torch.testing.assert_close(grad, torch.autograd.grad(fn(a), a, g)[0])



def test_scalar_read_of_an_input_compiles_per_value():
    """`y.item()` / `sz.tolist()` of an input in a Dynamo graph (unbacked symbols): a variant per
    value, Dynamo's size assertions evaluated on it (Inductor's test_cat_unbacked_2d,
    test_split_with_sizes_with_unbacked_symints)."""
    import torch._dynamo
    torch._dynamo.reset()

    def cat(x, y):
        return torch.cat([x, x.new_ones(y.item(), x.shape[1])]) * 2

    def split(sz, x):
        s0, s1 = sz.tolist()
        return torch.split(x, [s0, s1])[1].sort()

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        ccat = torch.compile(cat, backend=ember.backend, fullgraph=True)
        for n in (0, 4, 0, 5):
            x, y = torch.randn(2, 3), torch.tensor([n])
            torch.testing.assert_close(ccat(x, y), cat(x, y))
        csplit = torch.compile(split, backend=ember.backend, fullgraph=True)
        x = torch.randn(50)
        for sizes in ([20, 30], [7, 43]):
            torch.testing.assert_close(csplit(torch.tensor(sizes), x), split(torch.tensor(sizes), x))
        with pytest.raises(RuntimeError):
            csplit(torch.tensor([20, 20]), x)       # eager: split sizes do not sum to 50
    torch._dynamo.reset()


def test_scalar_read_variants_are_bounded():
    """A value that changes every call: VALUE_VARIANTS compiled variants, then eager (warned)."""
    import warnings

    import torch._dynamo
    from ember.aot import foreign
    torch._dynamo.reset()

    def f(x, y):
        return x * y.item() + 1

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        cf = torch.compile(f, backend=ember.backend, fullgraph=True)
        x = torch.randn(4)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for v in range(foreign.VALUE_VARIANTS + 2):
                torch.testing.assert_close(cf(x, torch.tensor(v)), f(x, torch.tensor(v)))
    assert any("runs eagerly now" in str(w.message) for w in seen)
    torch._dynamo.reset()

