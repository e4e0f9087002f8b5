"""aot tracer: an in-place view op (squeeze_) on a view of an intermediate. vmap's batching rule
for a per-sample 1-D @ 2-D matmul emits one, so per-sample gradients of a Linear model
(vmap(grad(functional_call))) were refused ("in-place metadata change ... of a view"). The view
is regenerated from its parent through both ops (tracer._then)."""
import pytest
import torch

from .test_fuzz_regressions import _check


@pytest.mark.parametrize("grad", [False, True])
def test_squeeze_of_a_view_then_base_mutated(grad):
    def f(x):
        y = x * 2
        v = y.unsqueeze(0)[:, 1:]
        v.squeeze_(0)
        out = v * 3                   # read before the base changes
        y.mul_(-1)                    # v now reads the new base: regenerated through both ops
        return (out, v + 1, y)
    x = torch.randn(5, requires_grad=grad)
    _check(f, x, opaque=True)


def test_per_sample_grads_of_a_linear_model_under_vmap():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    names = [k for k, _ in m.named_parameters()]

    def psg(w0, b0, w1, b1, x, y):
        def loss(p, xi, yi):
            return (torch.func.functional_call(m, p, (xi,)) - yi).pow(2).sum()
        g = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(
            dict(zip(names, (w0, b0, w1, b1))), x, y)
        return tuple(g[k] for k in names)
    params = [p.detach() for p in m.parameters()]
    _check(psg, *params, torch.randn(8, 4), torch.randn(8, 1), opaque=True)
