"""Complex values as real pairs (ember/decomp/complex.py): each rewritten op compiled by the
kernel backend vs eager (complex64 and complex128, broadcasting, Python and 0-dim operands),
the count of externs left (only the free view_as_real/view_as_complex at the graph's edges),
grads through complex math vs eager, conjugate views, and an FFT that stays an extern."""
import re

import pytest
import torch

import ember
from ember.aot import trace_aten
from ember.backends.ember import STATS, _complex_as_real_pairs
from ember.codegen.cpp import generate_tu
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.schedule import schedule
from tests.unit.lower.helpers import compile_fn

EDGE_VIEWS = {"aten.view_as_real.default", "aten.view_as_complex.default"}
C64, C128 = torch.complex64, torch.complex128


def cplx(*shape, dtype=C64):
    return torch.randn(*shape, dtype=dtype)


def real(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def check(fn, *args, tol=None):
    """fn compiled by the kernel backend equals eager; returns the graph's stats."""
    run, stats = compile_fn(fn, *args)
    got, ref = run(*args), fn(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, r.dtype, g.shape, r.shape)
        assert g.stride() == r.stride() or not r.is_contiguous(), (g.stride(), r.stride())
        t = tol or (1e-5 if r.dtype in (C64, torch.float32) else 1e-12)
        torch.testing.assert_close(g, r, atol=t, rtol=t, equal_nan=True)
    return stats


def compiled_math(stats):
    """The graph computes its complex math in kernels: no extern but the edge views."""
    assert stats["kernels"] >= 1, stats
    assert set(stats["fallbacks"]) <= EDGE_VIEWS, stats


OPS = {
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "neg_conj": lambda a, b: -a + b.conj(),
    "conj_physical": lambda a, b: torch.conj_physical(a) * b,
    "abs_angle": lambda a, b: (a.abs() + b.angle(), (a * b).abs()),
    "exp": lambda a, b: torch.exp(a) - b,
    "sgn": lambda a, b: torch.sgn(a * b),
    "reciprocal": lambda a, b: torch.reciprocal(a) + b,
    "real_imag": lambda a, b: ((a * b).real * 2, (a * b).imag + 1),
    "compare": lambda a, b: (a == b, a != a * 1, a == 0, torch.where(a.real > 0, a, 0) != 0),
    "pad_index_flip": lambda a, b: (torch.nn.functional.pad(a * b, (1, 2)), (a * b)[[2, 0]],
                                    torch.flip(a, [0]) * b, torch.roll(a, 1, 1) + b,
                                    torch.tril(a * b)),
    "where": lambda a, b: torch.where(a.real > 0, a, b),
    "sum_mean": lambda a, b: ((a * b).sum(-1), (a * b).mean(0, keepdim=True), (a + b).sum()),
    "cat_stack": lambda a, b: (torch.cat([a, b], -1) * 2, torch.stack([a, b], 0) + 1),
    "views": lambda a, b: ((a * b).permute(1, 0) + 1, (a * b).reshape(-1)[2:7] * 2,
                           (a * b).unsqueeze(1).expand(3, 2, 4) - 1, (a * b)[1] * 3,
                           (a * b).t() * 2, (a * b)[:, ::2] + 1),
    "split_unbind": lambda a, b: tuple(x * 2 for x in (a * b).split(1, 0)) +
                                 tuple(x + 1 for x in (a * b).unbind(1)),
    "clone_copy": lambda a, b: (a * b).clone() + torch.zeros_like(a).copy_(b),
}


@pytest.mark.parametrize("dtype", [C64, C128])
@pytest.mark.parametrize("name", sorted(OPS))
def test_op(name, dtype):
    a, b = cplx(3, 4, dtype=dtype), cplx(3, 4, dtype=dtype)
    compiled_math(check(OPS[name], a, b))


@pytest.mark.parametrize("dtype", [C64, C128])
def test_broadcast_and_mixed_operands(dtype):
    a, b = cplx(3, 1, 4, dtype=dtype), cplx(5, 1, dtype=dtype)
    r = real(5, 4, dtype=torch.float64 if dtype == C128 else torch.float32)
    zero_dim = torch.tensor(1.5, dtype=torch.float64)      # a 0-dim double: stays complex64
    ints = torch.arange(4)

    def fn(a, b, r, s, i):
        return (a * b, a / b, a + r, r * a, a * s, s / a, a * 2, a * 1.5j, 2j - a,
                a * i, torch.complex(r, r * 2) + a, torch.polar(r.abs(), r) * b)
    compiled_math(check(fn, a, b, r, zero_dim, ints))


def test_creation_and_casts():
    def fn(a, r):
        z = torch.full((3, 4), 1 - 2j) + a
        w = torch.zeros(3, 4, dtype=torch.complex64) + a.to(torch.complex128)
        return z, w, r.to(torch.complex64) * a, (a * a).to(torch.float32) if False else z.real
    a, r = cplx(3, 4), real(3, 4)
    compiled_math(check(fn, a, r))


def test_division_edge_values():
    a = torch.tensor([1 + 1j, 1e30 + 1e30j, 0j, float("inf") + 0j, 3 - 4j], dtype=C64)
    b = torch.tensor([0j, 1e30 - 2e30j, 0j, 1 + 0j, 1e-30 + 1e-30j], dtype=C64)
    check(lambda a, b: (a / b, a.abs(), b.abs(), torch.exp(a.real + 0j)), a, b)


def test_complex_inputs_and_outputs_layouts():
    # a permuted complex output keeps its strides; a view of an input output is rebuilt by aot
    def fn(a, b):
        return (a * b).permute(1, 0), a * 2
    a, b = cplx(3, 4), cplx(3, 4)
    stats = check(fn, a, b)
    compiled_math(stats)


def test_conjugate_views():
    def fn(a, b):
        return a.conj() * b, a.conj().imag * 2 + 1, torch.view_as_real(b.conj().resolve_conj())
    a, b = cplx(3, 4), cplx(3, 4)
    compiled_math(check(fn, a, b))
    # a conjugate view passed in (its conj bit is not part of the traced input)
    c = ember.compile(lambda a, b: a * b + 1)
    for x in (a.conj(), a, a.conj(), torch._neg_view(a)):
        torch.testing.assert_close(c(x, b), x * b + 1)


def _rope_eager(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


def _freqs(seq, dim, dtype=torch.float32):
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
    t = torch.arange(seq, dtype=dtype)
    return torch.polar(torch.ones(seq, dim // 2, dtype=dtype), torch.outer(t, inv))


def test_rope_llama_values_grads_and_kernels():
    """LLaMA's apply_rotary_emb on q and k: values and grads equal eager, and the complex
    math runs in kernels (the only externs: free views at the graph's edges)."""
    b, s, h, d = 2, 16, 4, 32
    freqs = _freqs(s, d).view(1, s, 1, d // 2)

    def rope(q, k, freqs):
        return _rope_eager(q, freqs), _rope_eager(k, freqs)
    q0, k0 = real(b, s, h, d), real(b, s, h, d)
    q1, k1 = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    q2, k2 = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    STATS.clear()
    c = ember.compile(rope)
    got = c(q1, k1, freqs)
    ref = rope(q2, k2, freqs)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    (got[0].square().sum() + got[1].sum()).backward()
    (ref[0].square().sum() + ref[1].sum()).backward()
    torch.testing.assert_close(q1.grad, q2.grad, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(k1.grad, k2.grad, atol=1e-4, rtol=1e-5)
    assert len(STATS) == 2, STATS                  # forward and backward
    for st in STATS:
        compiled_math(st)


def test_grads_of_real_loss_through_complex_ops():
    def fn(r, t, w):
        z = torch.polar(r, t) * w
        return (z.abs() + z.angle() + torch.exp(z / w.conj()).real).sum()
    r0, t0, w0 = real(6).abs() + 0.5, real(6), cplx(6)
    args1 = [x.clone().requires_grad_() for x in (r0, t0, w0)]
    args2 = [x.clone().requires_grad_() for x in (r0, t0, w0)]
    STATS.clear()
    out1 = ember.compile(fn)(*args1)
    out2 = fn(*args2)
    torch.testing.assert_close(out1, out2, atol=1e-4, rtol=1e-5)
    out1.backward()
    out2.backward()
    for a, b in zip(args1, args2):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4)
    for st in STATS:
        compiled_math(st)


def test_fft_stays_extern_and_the_math_around_it_compiles():
    def fn(x, filt):
        spec = torch.fft.rfft(x * 2 + 1)
        return torch.fft.irfft(spec * filt + spec.conj() * 0.5, n=16) + x
    x, filt = real(4, 16), cplx(9)
    stats = check(fn, x, filt, tol=1e-4)
    fft = [f for f in stats["fallbacks"] if "fft" in f]
    assert fft and stats["kernels"] >= 2, stats
    assert set(stats["fallbacks"]) - set(fft) <= EDGE_VIEWS, stats


def test_complex_matmul_stays_extern():
    a, b = cplx(3, 4), cplx(4, 5)
    stats = check(lambda a, b: (a @ b) * 2 + a.sum(), a, b)
    assert "aten.mm.default" in stats["fallbacks"] or stats["externs"] >= 1, stats


def test_pair_kernel_vectorizes_over_the_dim_above_the_pair():
    """The re/im results of a complex multiply are stored by ONE kernel whose simd loop runs
    over the complex elements (the pair dim unrolled), not a 2-lane loop per element."""
    a, b = cplx(8, 64), cplx(8, 64)
    gm = trace_aten(lambda a, b: a * b, (a, b), decompositions=get_decompositions())
    g = GraphLowering(_complex_as_real_pairs(gm, [a, b]), [a, b]).run()
    plan = schedule(g)
    src, _ = generate_tu(plan.kernels, plan.deps, plan.buffers)
    assert len(plan.kernels) == 1
    simd = re.findall(r"#pragma omp[^\n]*simd[^\n]*\n\s*for \(int64_t (v\d+) = 0; \1 < (\d+);", src)
    assert simd and all(int(n) > 2 for _, n in simd), src


def test_dynamo_capture_and_dynamic_shapes():
    """Through torch.compile(backend=ember.backend) the complex math compiles too; with
    dynamic shapes the graph is not re-traced (that would specialize its sizes) and its complex
    ops stay externs, values equal either way."""
    def fn(x, f):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * f).flatten(-2) * 2
    f = torch.polar(torch.ones(8), torch.randn(8))
    STATS.clear()
    c = torch.compile(fn, backend=ember.backend)
    x = real(3, 16)
    torch.testing.assert_close(c(x, f), fn(x, f))
    compiled_math(STATS[-1])
    d = ember.compile(fn, dynamic=True)
    for n in (3, 5):
        x = real(n, 16)
        torch.testing.assert_close(d(x, f), fn(x, f))


def test_complex32_stays_extern():
    """complex32 has no real-pair rule (and no promotion entry): its ops stay aten externs."""
    a = torch.randn(8, dtype=torch.complex64).to(torch.complex32)
    stats = check(lambda a: a + a, a, tol=1e-3)
    assert "aten.add.Tensor" in stats["fallbacks"], stats
