"""Dynamo graphs with data-dependent sizes (unbacked symbols: nonzero, masked_select, boolean
indexing, .item() of a computed tensor) are split at the data reads (backends/split.py): the
reads run as written, the segments around them compile once and read the data-dependent sizes
at run time. They were refused in aot ("an unbacked size symbol"), so the graph ran eagerly."""
import pytest
import torch
import torch._dynamo

import ember
from ember.backends.ember import STATS


@pytest.fixture(autouse=True)
def _unbacked():
    torch._dynamo.reset()
    STATS.clear()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True,
                                    capture_scalar_outputs=True):
        yield
    torch._dynamo.reset()


def _check(got, ref):
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)


def test_data_dependent_sizes_compile_once_for_every_count():
    def f(x, m):
        s = torch.masked_select(x, m)
        return (s * 2).sum() + s.shape[0], torch.exp(x[x > 0]) + 1, x.sin() * 3

    cf = torch.compile(f, backend=ember.backend, fullgraph=True)
    counts = set()
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(64, generator=g)
        m = torch.rand(64, generator=g) > 0.5
        counts.add(int(m.sum()))
        _check(cf(x, m), f(x, m))
        if seed == 0:
            compiled = len(STATS)
    assert len(counts) > 1                      # the data-dependent sizes did change
    assert compiled >= 2 and len(STATS) == compiled, STATS   # and nothing recompiled
    assert sum(s.get("kernels", 0) for s in STATS) >= 2, STATS


def test_nonzero_with_a_size_check_raises_as_eager():
    def f(x):
        z = x.nonzero()
        torch._check(z.size(0) == 4)
        return z + 3

    cf = torch.compile(f, backend=ember.backend)
    x = torch.tensor([0, 1, 3, 4, 2, 0, 0])
    assert torch.equal(cf(x), f(x))
    with pytest.raises(RuntimeError):
        cf(torch.tensor([0, 0, 0, 1, 0, 0, 0]))


def test_item_of_a_computed_value_sizes_later_work():
    def f(x):
        n = (x > 0).sum().item()
        return x.new_zeros(n) + 1, x[:n] * 2

    cf = torch.compile(f, backend=ember.backend)
    for seed in range(3):
        x = torch.randn(40, generator=torch.Generator().manual_seed(seed))
        _check(cf(x), f(x))


def test_grads_flow_through_the_data_dependent_op():
    def f(x, w):
        y = (x * w).tanh()
        return (y[y > 0] ** 2).sum() + (x * 2).sum()

    cf = torch.compile(f, backend=ember.backend)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(32, generator=g, requires_grad=True)
        w = torch.randn(32, generator=g, requires_grad=True)
        out = cf(x, w)
        gx, gw = torch.autograd.grad(out, (x, w))
        ref = f(x, w)
        rx, rw = torch.autograd.grad(ref, (x, w))
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(gx, rx)
        torch.testing.assert_close(gw, rw)
