"""lower: a reshape/permute of a pointwise value that is stored in a layout of its own (a graph
output's traced strides, a cast keeping its input's transposed layout) views that storage with
strides derived from the layout it is stored in. They were derived from the row-major layout
while the value was stored in its preferred one, so the extern reading the view (an mm) got
permuted elements: tanh(x0) @ x1 with x0 transposed, 528/528 outputs wrong (fuzz, once the
partitioner saved tanh(x0) for the backward)."""
import torch
import torch.nn.functional as F

import ember

from .helpers import check


def _tanh_mm_saved(x0, x1):
    t = torch.tanh(x0)
    return t @ x1, t


def test_viewed_output_stored_in_its_traced_layout():
    x0 = torch.randn(5, 1, 33).transpose(0, 2)          # (33, 1, 5), strides (1, 33, 33)
    check(_tanh_mm_saved, x0, torch.randn(5, 16))


def test_viewed_cast_of_transposed_weight():
    # a weight kept as (in, out): its (out, in) view cast to float keeps the transposed layout,
    # and linear's permute of it is a view of that storage
    q = torch.randint(-8, 8, (16, 24), dtype=torch.int8)
    check(lambda x, q: (F.linear(x, q.t().float()),), torch.randn(3, 16), q)


def test_saved_tanh_viewed_into_mm_grads_match_eager():
    # the fuzz program (tests/fuzz seeds 5-9): the partitioner saves tanh(x0) for the backward,
    # so the forward stores it in its traced layout and views it for the mm
    def prog(x0, x1):
        return (torch.tanh(x0) @ x1,)
    torch.manual_seed(0)
    x0 = torch.randn(5, 1, 33).transpose(0, 2).requires_grad_()
    x1 = torch.randn(5, 16, requires_grad=True)
    (want,) = prog(x0, x1)
    (got,) = ember.compile(prog, fullgraph=True)(x0, x1)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    g = torch.randn(want.shape)
    for a, b in zip(torch.autograd.grad(got, (x0, x1), g), torch.autograd.grad(want, (x0, x1), g)):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
