"""Column sums computed in the row kernel that reads their inputs (schedule/columns.py,
docs/design/038-column-partials.md): LayerNorm's and RMSNorm's weight/bias gradients are
accumulated in the input-gradient kernel's row loop (per-thread partials), so dY and x are read
by one kernel. Values and every gradient against eager in float32."""
import copy

import pytest
import torch

import ember
from ember.aot import trace_aten
from ember.codegen.cpp import generate_tu
from ember.decomp import get_decompositions
from ember.lower.lowering import GraphLowering
from ember.schedule import schedule
from tests.unit.lower.helpers import check

aten = torch.ops.aten


def _plan(fn, *args, columns=True):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    plan = schedule(GraphLowering(gm, list(args)).run(), columns=columns)
    return plan, generate_tu(plan.kernels, plan.deps, plan.buffers)[0]


def _ln_backward(dy, x, mean, rstd, w, b):
    return aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b,
                                           [True, True, True])


@pytest.mark.parametrize("rows,c", [(20, 33), (64, 769), (4100, 40)])
def test_layernorm_backward_reads_dy_in_one_kernel(rows, c):
    x = torch.randn(rows, c)
    mean, rstd = x.mean(1, keepdim=True), torch.rsqrt(x.var(1, unbiased=False, keepdim=True) + 1e-5)
    args = [torch.randn(rows, c), x, mean, rstd, torch.randn(c), torch.randn(c)]
    plan, src = _plan(_ln_backward, *args)
    dy = plan.inputs[0].name
    readers = [i for i, r in enumerate(plan.reads) if dy in r]
    assert len(readers) == 1 and len(plan.kernels) == 1, plan.reads
    k = plan.steps[readers[0]]
    assert sorted(len(s.columns) for s in k.stages)[-1] == 2       # dgamma and dbeta
    body = src[src.index(f"void {k.name}("):]
    assert "ember::Zeroed<float>" in body
    assert ("#pragma omp for" in body) == (rows * c >= 32768)      # parallel: the rows shared
    assert ("ember::Zeroed<double>" in body) == (rows >= 4096)      # long sums: cascaded
    # without the rule (Triton): a separate column kernel re-reads dy
    plan2, _ = _plan(_ln_backward, *args, columns=False)
    assert sum(dy in r for r in plan2.reads) == 2
    check(_ln_backward, *args, atol=1e-4, rtol=1e-4, kernels=1)


def _train_check(mod, x, threads=None):
    """Output, input gradient and parameter gradients of `mod` under ember vs eager (fp32:
    max|err| <= 2e-5 * max|eager| + 1e-6 per tensor); EMBER_STRICT=1 makes a fallback raise."""
    ref, comp = mod, ember.compile(copy.deepcopy(mod))
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        xs = [x.detach().clone().requires_grad_() for _ in range(2)]
        outs = [m(t) for m, t in zip((ref, comp), xs)]
        g = torch.randn_like(outs[0])
        for o in outs:
            o.backward(g)
    finally:
        torch.set_num_threads(old)
    pairs = [(outs[1], outs[0]), (xs[1].grad, xs[0].grad)]
    pairs += [(q.grad, p.grad) for p, q in zip(ref.parameters(), comp.parameters())]
    for got, want in pairs:
        assert got is not None and got.shape == want.shape
        err = (got - want).abs().max().item()
        assert err <= 2e-5 * want.abs().max().item() + 1e-6, err


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.nn.LayerNorm(769), (3, 769)),                    # few rows, odd C
    (lambda: torch.nn.LayerNorm(33), (4100, 33)),                   # many rows: cascaded
    (lambda: torch.nn.LayerNorm(768), (2, 64, 768)),                # [B, T, C]
    (lambda: torch.nn.LayerNorm(33, bias=False), (70, 33)),
    (lambda: torch.nn.LayerNorm(33, elementwise_affine=False), (70, 33)),
    (lambda: torch.nn.RMSNorm(769), (2, 33, 769)),
    (lambda: torch.nn.GroupNorm(3, 33), (4, 33, 5, 7)),
])
@pytest.mark.parametrize("threads", [None, 3])
def test_norm_training_against_eager(make, shape, threads):
    torch.manual_seed(0)
    m = make()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    _train_check(m, torch.randn(*shape), threads)


def test_non_contiguous_input():
    torch.manual_seed(0)
    m = torch.nn.LayerNorm(769)
    x = torch.randn(769, 50).t()                        # [50, 769], column-major
    _train_check(m, x)


class _SoftmaxSum(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1).sum(0)


def test_sum_over_rows_of_a_row_kernel_output():
    """`softmax(x).sum(0)`: the column sum runs in the softmax kernel, in a last loop over the
    row; the exp row is then a row scratch, never stored."""
    x = torch.randn(256, 1000)
    plan, _ = _plan(lambda t: torch.softmax(t, -1).sum(0), x)
    assert len(plan.kernels) == 1 and plan.kernels[0].row_local
    check(lambda t: torch.softmax(t, -1).sum(0), x, atol=1e-5, rtol=1e-5, kernels=1)
    _train_check(_SoftmaxSum(), x)


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x)


def test_linear_bias_gradients_in_the_row_kernels():
    """A linear layer's bias gradient sums its output gradient over the flattened [B*T] rows:
    fc2's is added in LayerNorm's input-gradient kernel (rows B, T), fc1's in the GELU backward
    (a pointwise kernel split into rows of 256)."""
    x = torch.randn(8, 100, 64)

    def fn(dy, h, a, m, r, w, b):
        dx, dw, db = aten.native_layer_norm_backward(dy, h, [64], m, r, w, b, [True] * 3)
        dgelu = aten.gelu_backward(dx @ torch.ones(64, 256), a)
        return dx.sum((0, 1)), dgelu.sum((0, 1)), dw, db, dgelu     # dgelu: fc1's weight grad's
    m_, r_ = x.mean(-1, keepdim=True), torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    args = [torch.randn(8, 100, 64), x, torch.randn(8, 100, 256), m_, r_, torch.randn(64),
            torch.randn(64)]
    plan, _ = _plan(fn, *args)
    sums = {n.name for k in plan.kernels for s in k.stages for n in s.columns}
    assert len(sums) == 4 and len(plan.kernels) == 3, plan.steps     # + the ones(64, 256) fill
    assert [s.inner for k in plan.kernels for s in k.stages if s.columns] == [(64,), (256,)]
    check(fn, *args, atol=1e-4, rtol=1e-4)
    torch.manual_seed(0)
    _train_check(_Mlp(), x)


def test_groupnorm_weight_gradients_in_the_row_sum_kernel():
    """GroupNorm's weight/bias gradients sum per-(n, c) row sums over n (outputs [G, C/G] and
    [C]): from those [N, C] sums (computed in the one kernel that reads dy, segments.py), not
    by a column kernel over C reading dy again."""
    n, c, hw, g = 16, 64, 300, 8
    x = torch.randn(n, c, hw)
    xg = x.view(n, g, -1)
    mean, rstd = xg.mean(-1), torch.rsqrt(xg.var(-1, unbiased=False) + 1e-5)

    def fn(dy, x, mean, rstd, w):
        return aten.native_group_norm_backward(dy, x, mean, rstd, w, n, c, hw, g, [True] * 3)
    args = [torch.randn(n, c, hw), x, mean, rstd, torch.randn(c)]
    plan, _ = _plan(fn, *args)
    assert sum(plan.inputs[0].name in r for r in plan.reads) == 1, plan.reads
    assert not any(len(k.stages) == 1 and k.stages[0].kind == "reduction" and k.outer == (c,)
                   for k in plan.kernels)
    check(fn, *args, atol=1e-4, rtol=1e-4)
