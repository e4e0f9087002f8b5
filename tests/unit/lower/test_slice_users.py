"""lower: a value whose users are all slices of disjoint ranges of one dim (a cat's backward, a
split) stays inlined: the slices compute each element once between them, in one kernel, with no
stored copy of the whole value re-read."""
import pytest
import torch

import ember

from .helpers import check


def _parts(sizes, dim):
    def fn(x, g):
        grad = torch.where(x <= 0, torch.zeros(()), g)      # relu's backward
        out, at = [], 0
        for n in sizes:
            out.append(grad.narrow(dim, at, n))
            at += n
        return tuple(out)
    return fn


@pytest.mark.parametrize("sizes,dim", [((16,) * 4, 1), ((3, 7, 5), 1), ((2, 9), -1)])
def test_disjoint_slices_are_one_kernel(sizes, dim):
    shape = [4, sum(sizes), 6, 9] if dim == 1 else [4, 3, 6, sum(sizes)]
    x, g = torch.randn(shape), torch.randn(shape)
    stats = check(_parts(sizes, dim), x, g, atol=0, rtol=0)
    assert stats["kernels"] == len(set(sizes)), stats   # one per slice shape, no stored grad


def test_overlapping_slices_keep_the_stored_value():
    x, g = torch.randn(4, 32, 6, 9), torch.randn(4, 32, 6, 9)

    def fn(a, b):
        grad = torch.where(a <= 0, torch.zeros(()), b)
        return grad[:, :20], grad[:, 10:]
    stats = check(fn, x, g, atol=0, rtol=0)
    assert stats["kernels"] == 2, stats


@pytest.mark.parametrize("channels_last", [False, True])
def test_cat_relu_training_matches_eager(channels_last):
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    xs = [torch.randn(3, c, 7, 5).to(memory_format=fmt).requires_grad_() for c in (4, 3, 9)]
    f = lambda *t: torch.cat(t, 1).relu() * 2  # noqa: E731
    go = torch.randn(3, 16, 7, 5)
    ref = f(*xs)
    gref = torch.autograd.grad(ref, xs, go)
    ys = [x.detach().clone().requires_grad_() for x in xs]
    got = ember.compile(f, options={"speed_check": False})(*ys)
    ggot = torch.autograd.grad(got, ys, go)
    torch.testing.assert_close(got, ref, atol=0, rtol=0)
    for a, b in zip(ggot, gref):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
