"""Real tensors with the negative bit (`torch._neg_view`, the imaginary part of `z.conj()`) as
graph inputs: ember's kernels read storage as it is, so such an input is resolved before the
compiled graph runs (backends/ember.py), the guards tell it from a plain tensor (one recompile
per change, in ember's capture and Dynamo's), and a mutation of it reaches the caller's tensor
through its view, as in eager. These read the negated storage silently before."""
import pytest
import torch
import torch._dynamo

import ember


def _neg(x):
    view = torch._neg_view(x.neg())     # values == x, storage holds -x
    assert view.is_neg()
    return view


def _compilers():
    yield "ember", lambda f: ember.compile(f)
    yield "dynamo", lambda f: torch.compile(f, backend=ember.backend)


@pytest.mark.parametrize("front", ["ember", "dynamo"])
def test_negative_view_inputs_read_their_values(front):
    torch._dynamo.reset()
    compile_ = dict(_compilers())[front]

    def f(a, b):
        return a * 2 + b.exp(), (a - b).sum(1)

    cf = compile_(f)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    imag = torch.randn(4, 5, dtype=torch.complex64).conj().imag
    assert imag.is_neg()
    for a, b in [(x, y), (_neg(x), y), (x, imag), (_neg(x), _neg(y)), (x, y)]:
        for got, ref in zip(cf(a, b), f(a, b)):
            torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_negative_view_flips_recompile_once_each():
    def f(a):
        return a.sin() + 1

    cf = ember.compile(f)
    x = torch.randn(8)
    before = ember.stats()["counts"].get("recompiles", 0)
    for a in (x, _neg(x), x, _neg(x)):
        torch.testing.assert_close(cf(a), f(a))
    assert ember.stats()["counts"].get("recompiles", 0) - before == 1


@pytest.mark.parametrize("front", ["ember", "dynamo"])
def test_mutated_negative_view_writes_through(front):
    torch._dynamo.reset()
    compile_ = dict(_compilers())[front]

    def f(a, b):
        a.add_(b)
        return a * 3

    base_e, base_c = torch.randn(6), None
    base_c = base_e.clone()
    b = torch.randn(6)
    a_e, a_c = torch._neg_view(base_e), torch._neg_view(base_c)
    ref = f(a_e, b)
    got = compile_(f)(a_c, b)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(base_c, base_e)      # the storage behind the view, negated
    torch.testing.assert_close(a_c, a_e)


def test_negative_view_gradients():
    def f(a, w):
        return (a * w).tanh().sum()

    w = torch.randn(5, requires_grad=True)
    z = torch.randn(5, dtype=torch.complex64, requires_grad=True)
    ref_w = w.detach().clone().requires_grad_(True)
    ref_z = z.detach().clone().requires_grad_(True)
    ember.compile(f)(z.conj().imag, w).backward()
    f(ref_z.conj().imag, ref_w).backward()
    torch.testing.assert_close(w.grad, ref_w.grad)
    torch.testing.assert_close(z.grad, ref_z.grad)
