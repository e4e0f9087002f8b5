"""Store or recompute a pointwise value with several users (ember/lower/recompute.py, design 039)."""
import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock, Bottleneck

import ember
from ember.aot import trace_aten
from ember.decomp import get_decompositions
from ember.loopir.nodes import ComputedBuffer, Reduction
from ember.lower.lowering import GraphLowering

from .helpers import check


def _bn_relu_backward(dy, y, x, mean, rstd, w):
    # BatchNorm(train)+ReLU backward as aten writes it: the masked gradient g feeds both
    # per-channel sums and dX
    n = x.numel() / x.shape[1]
    g = torch.where(y <= 0, 0, dy)
    xc = x - mean
    s1, s2 = g.sum((0, 2, 3)), (g * xc).sum((0, 2, 3))
    dx = (g - xc * (s2 / n * rstd * rstd).view(1, -1, 1, 1) - (s1 / n).view(1, -1, 1, 1)) \
        * (rstd * w).view(1, -1, 1, 1)
    return dx, s1, s2 * rstd


def _bn_args(cl=False):
    fmt = torch.channels_last if cl else torch.contiguous_format
    dy, y, x = (torch.randn(4, 8, 10, 12).to(memory_format=fmt) for _ in range(3))
    return dy, y, x, torch.randn(1, 8, 1, 1), torch.rand(8) + 0.5, torch.randn(8)


def _lower(fn, *args):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    return GraphLowering(gm, list(args)).run()


def test_masked_gradient_is_recomputed_not_stored():
    # stored, g costs a write and two reads per element (5 accesses with its inputs); inlined,
    # the sums' kernel and dX's kernel read dy and y themselves (4), and x they read anyway
    low = _lower(_bn_relu_backward, *_bn_args())
    full = [b for b in low.nodes if isinstance(b, ComputedBuffer) and
            not isinstance(b.body, Reduction) and tuple(b.size) == (4, 8, 10, 12)]
    assert len(full) == 1, [b.name for b in full]          # dX only, no buffer for g
    assert sum(isinstance(b.body, Reduction) for b in low.nodes if isinstance(b, ComputedBuffer)) == 2


@pytest.mark.parametrize("cl", [False, True])
def test_bn_relu_backward_values_and_kernels(cl, tmp_path, monkeypatch):
    # two kernels (both sums in one, dX in the other; three with g stored), values as
    # eager's within fp32 rounding
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    check(_bn_relu_backward, *_bn_args(cl), atol=1e-4, rtol=1e-4, kernels=2)


def test_a_consumer_that_needs_a_buffer_keeps_it_stored():
    # an extern (mm) reads the masked value itself: it is stored once and every user reads it
    def f(a, b, w):
        g = torch.where(a > 0, b, 0)
        return g @ w, g.sum(0)
    low = _lower(f, torch.randn(16, 32), torch.randn(16, 32), torch.randn(32, 8))
    full = [b for b in low.nodes if isinstance(b, ComputedBuffer) and tuple(b.size) == (16, 32)]
    assert len(full) == 1
    check(f, torch.randn(16, 32), torch.randn(16, 32), torch.randn(32, 8), atol=1e-5)


def test_an_expensive_body_stays_stored():
    # a transcendental over two inputs is computed once, whatever the loads cost
    def f(a, b):
        g = torch.sigmoid(a * b)
        return g.sum(0), g * a
    low = _lower(f, torch.randn(16, 32), torch.randn(16, 32))
    assert sum(isinstance(b, ComputedBuffer) and tuple(b.size) == (16, 32) for b in low.nodes) == 2


def _conv_bn_relu():
    return torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1, bias=False),
                               torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, padding=1, bias=False),
                               torch.nn.BatchNorm2d(16), torch.nn.ReLU())


BLOCKS = {
    "conv_bn_relu": (_conv_bn_relu, (2, 8, 12, 12)),
    "basic_block": (lambda: BasicBlock(16, 16), (2, 16, 10, 10)),
    "bottleneck": (lambda: Bottleneck(64, 16), (2, 64, 8, 8)),
    "bottleneck_down": (lambda: Bottleneck(32, 16, stride=2, downsample=torch.nn.Sequential(
        torch.nn.Conv2d(32, 64, 1, stride=2, bias=False), torch.nn.BatchNorm2d(64))),
        (2, 32, 10, 10)),
}


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_blocks_train_like_eager(name, cl, tmp_path, monkeypatch):
    # outputs, input and parameter grads, running stats over two steps; fp32: the sums'
    # order differs from oneDNN's (atol/rtol 2e-4 on values of order 1)
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))   # lower runs, and dumps
    build, shape = BLOCKS[name]
    torch.manual_seed(0)
    fmt = torch.channels_last if cl else torch.contiguous_format
    m = build().train().to(memory_format=fmt)
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    for step in range(2):
        x = torch.randn(shape).to(memory_format=fmt)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, want = c(xc), ref(xe)
        torch.testing.assert_close(out, want, atol=2e-4, rtol=2e-4)
        assert out.is_contiguous(memory_format=fmt)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        (want * torch.linspace(-1, 1, want.numel()).view_as(want)).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, atol=2e-4, rtol=2e-4)
        for (k, p), q in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=5e-4, rtol=2e-4, msg=k)
    for a, b in zip(m.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # the backward stores no masked gradient: a full-size pointwise buffer it writes that no
    # extern (a conv's backward) reads and that is no output is not a where(mask, 0, dY)
    sched = "\n".join(p.read_text() for p in tmp_path.rglob("*backward_schedule.py"))
    lower = "\n".join(p.read_text() for p in tmp_path.rglob("*backward_lower.py"))
    stored = re.findall(r"def (buf\d+)\(x0, x1, x2, x3\):  # pointwise(.*?)\n\n", lower, re.S)
    assert stored
    returned = re.search(r"return \((.*)\)", sched).group(1).split(", ")
    for name, body in stored:
        if name not in returned and not re.search(rf"= aten\.\w+\.\w+\(.*\b{name}\b", sched):
            assert "ops.where" not in body, body


def test_residual_stream_behind_a_reshape_is_stored():
    # pre-LN blocks that reshape the residual stream (OPT: [B, T, C] -> [B*T, C] between
    # attention and MLP). The reshape of a pending sum has several users (the next LayerNorm,
    # the next residual add); it was never considered for storing, so every LayerNorm inlined
    # the sum from the first input on: the last one loaded every block's output (L + 1 buffers)
    from ember.schedule.deps import node_deps
    blocks = 6

    def f(x, lw, lb, *ws):
        h = x
        for w in ws:
            h = h.reshape(-1, 64)
            h = h + torch.relu(F.layer_norm(h, (64,), lw, lb) @ w)
            h = h.reshape(2, 32, 64)
        return F.layer_norm(h, (64,), lw, lb)
    args = (torch.randn(2, 32, 64), torch.randn(64), torch.randn(64),
            *(torch.randn(64, 64) / 8 for _ in range(blocks)))
    low = _lower(f, *args)
    reads = [len(node_deps(b).reads) for b in low.nodes if isinstance(b, ComputedBuffer)]
    assert max(reads) <= 6, reads        # before: 11, growing with the depth
    check(f, *args, atol=1e-4, rtol=1e-4)
