"""conv1d regions run as one-row channels-last conv2d on oneDNN (backends/layout.py
_conv1d_rows, docs/design/088): values and output strides vs eager, and the region rule."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.backends import layout as L

TOL = dict(atol=1e-4, rtol=1e-4)


def count(name):
    return ember.stats()["counts"].get(name, 0)


def check(ref, *xs, options=None):
    m = ember.compile(copy.deepcopy(ref), options=options or {})
    with torch.no_grad():
        for _ in range(2):
            outs, want = m(*xs), ref(*xs)
            for o, w in zip(outs, want):
                torch.testing.assert_close(o, w, **TOL)
                assert o.stride() == w.stride(), (o.stride(), w.stride())


class Encoder(nn.Module):
    """A positional conv (wav2vec2's: grouped, weight-normed, its input a transposed [N, L, C]
    activation, one position sliced off) and a dilated TCN pair after it, with GELU and a
    residual; outputs the [N, L, C] sum and a [N, C, L] conv output (eager: contiguous)."""

    def __init__(self, c=32):
        super().__init__()
        self.pos = nn.utils.parametrizations.weight_norm(
            nn.Conv1d(c, c, 16, padding=8, groups=4), dim=2)
        self.t1 = nn.Conv1d(c, c, 3, padding=2, dilation=2)
        self.t2 = nn.Conv1d(c, c, 3, padding=4, dilation=4)

    def forward(self, h):
        y = F.gelu(self.pos(h.transpose(1, 2))[:, :, :-1])
        t = self.t2(F.relu(self.t1(y))) + y
        return h + t.transpose(1, 2), t


@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "unfrozen"])
def test_conv1d_region_runs_channels_last(freeze):
    """The three convs are one region, none L1-aliased: all run channels-last, values and
    output strides as eager's (the [N, C, L] output made contiguous again)."""
    torch.manual_seed(0)
    check(Encoder().eval(), torch.randn(2, 40, 32), options={"freeze": freeze})
    assert count("conv1d_channels_last") == 3 and count("channels_last_graphs") == 1
    assert count("graphs") == 1


class Pair(nn.Module):
    """Two convs on a transposed [N, L, C] input; the second conv's output is the graph's."""

    def __init__(self, c=32):
        super().__init__()
        self.c0 = nn.Conv1d(c, c, 5, padding=2, groups=c)
        self.c1 = nn.Conv1d(c, c, 1)

    def forward(self, h):
        return (self.c1(F.silu(self.c0(h.transpose(1, 2)))),)


def test_conv1d_output_returned_in_eager_layout():
    """A row conv's output returned as it is comes back [N, C, L] contiguous, as eager's."""
    torch.manual_seed(0)
    check(Pair().eval(), torch.randn(2, 40, 32))
    assert count("conv1d_channels_last") == 2 and count("channels_last_graphs") == 1


class Stem(nn.Module):
    """wav2vec2's feature encoder in small: a first conv that gains channels-last, then
    512-channel stride-2 convs whose channels-last input pixels are 4 KiB apart (lose)."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv1d(1, 512, 10, stride=5)
        self.c1 = nn.Conv1d(512, 512, 3, stride=2)
        self.norm = nn.GroupNorm(512, 512)

    def forward(self, x):
        return (F.gelu(self.c1(F.gelu(self.norm(self.c0(x[:, None]))))).transpose(1, 2),)


def test_conv1d_region_with_an_aliased_conv_stays_as_captured():
    """One region, one of its convs L1-aliased: the whole region stays [N, C, L] (s24 ran the
    first conv channels-last and the next NCL: the GroupNorm and GELU between them
    transposed, 0.90x eager)."""
    torch.manual_seed(0)
    check(Stem().eval(), torch.randn(1, 800))
    assert count("conv1d_channels_last") == 0 and count("channels_last_graphs") == 0


def test_conv1d_regions_decided_apart():
    """Regions end where [N, C, ·] ends (a transpose to [N, L, C], a linear): the aliased
    stem's region stays, the conv after the linear runs channels-last."""
    def f(x, w0, w1, lw, w2):
        y = F.gelu(F.conv1d(F.gelu(F.conv1d(x, w0, None, 5)), w1, None, 2))
        z = F.linear(y.transpose(1, 2), lw).transpose(1, 2)
        return F.conv1d(z, w2, None, 1, 1)

    gm = torch.fx.symbolic_trace(f)
    xs = [torch.randn(1, 1, 800), torch.randn(512, 1, 10), torch.randn(512, 512, 3),
          torch.randn(64, 512), torch.randn(64, 64, 3)]

    class Record(torch.fx.Interpreter):
        def run_node(self, n):
            n.meta["example_value"] = out = super().run_node(n)
            return out
    Record(gm).run(*xs)
    rows = L._conv1d_rows(gm, xs)
    convs = [n for n in gm.graph.nodes if n.target is F.conv1d]
    assert rows == {convs[2]}
