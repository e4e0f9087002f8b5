"""Freezing and layout planning of graphs with symbolic sizes (docs/design/058).

A graph recompiled with symbolic sizes (a second batch/sequence size under dynamic=None) is
frozen like a static one: parameters have static sizes even when activations do not. Each test
compiles at two sizes (static, then dynamic), then runs sizes no compile saw: values against
eager (fp32, atol=rtol=1e-4: BatchNorm folding changes rounding), no compile per new size, and
the counters that say what was frozen, folded, packed and laid out channels-last."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
import ember.backends.freeze as fz
from ember.capture.entry import stats as capture_stats

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def count(name):
    return ember.stats()["counts"].get(name, 0)


def compiles():
    return capture_stats().get("graphs", 0)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return self.fc(y.mean((2, 3)))


def convnet(seed=0):
    torch.manual_seed(seed)
    m = ConvNet()
    for mod in m.modules():           # non-trivial statistics, so a stale fold shows
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m.eval()


def dynamic_pair(make, *first, trained=True):
    """(compiled, eager copy) after calls at the sizes `first` (the last one's graph is the
    dynamic one). `trained=False`: parameters that do not require grad."""
    m = make()
    ref = copy.deepcopy(m)
    m.requires_grad_(trained)
    c = ember.compile(m)
    with torch.no_grad():
        for x in first:
            torch.testing.assert_close(c(*x), ref(*x), **TOL)
    return c, ref


def check(c, ref, *x):
    with torch.no_grad():
        torch.testing.assert_close(c(*x), ref(*x), **TOL)


def test_conv_bn_graph_with_symbolic_batch_and_spatial_sizes_is_frozen_channels_last():
    from ember.backends.ember import STATS
    c, ref = dynamic_pair(convnet, (torch.randn(4, 3, 16, 16),), (torch.randn(3, 3, 12, 20),))
    assert count("frozen_graphs") == 2 and count("channels_last_graphs") == 2
    assert count("prepacked_convs") == 4          # 2 per graph, packed for the traced sizes
    # the conv outputs stay channels-last with symbolic sizes too (the meta `.to(memory_format
    # =channels_last)` of oneDNN's conv kept them NCHW: a copy kernel before each next conv)
    assert STATS[-1]["kernels"] == STATS[-2]["kernels"], STATS[-2:]
    n = compiles()
    for shape in [(5, 3, 16, 16), (2, 3, 9, 31), (7, 3, 24, 8), (3, 3, 12, 20)]:
        check(c, ref, torch.randn(*shape))
    assert compiles() == n                        # one dynamic graph serves every size


def test_channels_last_input_of_a_dynamic_graph_comes_back_in_eager_layout():
    c, ref = dynamic_pair(convnet, (torch.randn(4, 3, 16, 16),), (torch.randn(3, 3, 12, 20),))
    body = nn.Sequential(c.c1, c.b1)              # the conv block alone: a 4-D output
    eager_body = nn.Sequential(ref.c1, ref.b1)
    cb = ember.compile(body)
    with torch.no_grad():
        for shape in [(2, 3, 8, 8), (3, 3, 10, 6), (5, 3, 7, 9)]:
            for fmt in (torch.contiguous_format, torch.channels_last):
                x = torch.randn(*shape).contiguous(memory_format=fmt)
                got, want = cb(x), eager_body(x)
                torch.testing.assert_close(got, want, **TOL)
                assert got.stride() == want.stride()


@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("route", ["add_", "load_state_dict", "data_assign"])
def test_dynamic_frozen_graph_refolds_when_a_weight_changes(route, trained, monkeypatch):
    """Mutate a weight after the dynamic graph ran at a new size: the next call, at another new
    size, gives eager's values (the fold is checked per call, whatever the sizes). Weights that
    require grad, changed before a fold paid off, make the graph unfrozen (freeze.py) instead:
    whether it paid off compares measured times, so the test makes any refold too costly (a
    loaded machine's slow calls made it pay off now and then)."""
    monkeypatch.setattr(fz, "REFOLD_SHARE", 0.0)
    c, ref = dynamic_pair(convnet, (torch.randn(4, 3, 16, 16),), (torch.randn(3, 3, 12, 20),),
                          trained=trained)
    check(c, ref, torch.randn(5, 3, 10, 14))
    refolds = count("refolds")
    other = convnet(seed=1)
    with torch.no_grad():
        if route == "add_":
            for mod in (c, ref):
                mod.c2.weight.add_(0.25)
                mod.b1.running_var.mul_(2.0)
        elif route == "load_state_dict":
            c.load_state_dict(other.state_dict())
            ref.load_state_dict(other.state_dict())
        else:
            c.c1.weight.data = other.c1.weight.data.clone()
            ref.c1.weight.data = other.c1.weight.data.clone()
    n = compiles()
    check(c, ref, torch.randn(6, 3, 9, 11))
    check(c, ref, torch.randn(2, 3, 13, 7))
    assert compiles() == n
    if trained:
        assert count("unfrozen_graphs") == 1
    else:
        assert count("refolds") == refolds + 1 and count("unfrozen_graphs") == 0


class Decode(nn.Module):
    """A decode step's shape: a projection of one new token (M = 1, static; a wide output, so
    packing pays) and of a cache whose length is the dynamic size (M = T, symbolic)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 1024)
        self.kv = nn.Linear(256, 1024)

    def forward(self, tok, cache):
        q = self.up(tok)                              # [1, 1, 1024]
        k = self.kv(cache)                            # [1, T, 1024]
        return (q * k).sum(-1).softmax(-1)


def test_dynamic_graph_packs_static_row_linears_only():
    """In the dynamic graph the linear of static M is MKL-packed; the one whose M is a symbol is
    not (`_mkl_linear` packs for one M and falls back to a plain GEMM at any other)."""
    def inputs(t):
        return torch.randn(1, 1, 256), torch.randn(1, t, 256)
    torch.manual_seed(0)
    c, ref = dynamic_pair(Decode, inputs(6), inputs(9), trained=False)
    assert count("frozen_graphs") == 2
    # static graph: both (M = 1 wide, M = 6); dynamic graph: the M = 1 one only
    assert count("prepacked_linears") == 3
    n = compiles()
    for t in (5, 17, 40):
        check(c, ref, *inputs(t))
    with torch.no_grad():
        c.up.weight.mul_(-1.0)
        ref.up.weight.mul_(-1.0)
    check(c, ref, *inputs(23))
    assert compiles() == n and count("refolds") == 1


def test_dynamic_graph_not_frozen_when_training():
    m = convnet().train()
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    for shape in [(4, 3, 16, 16), (3, 3, 12, 20), (5, 3, 9, 9)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(c(x), ref(x), **TOL)
    # the static training graph runs channels-last; the dynamic one stays as captured
    assert count("frozen_graphs") == 0 and count("channels_last_graphs") == 1


class Cache:
    """Not a module: a DynamicCache-like holder whose tensor grows every call (its source,
    `L['cache'].k`, looks like module state)."""

    def __init__(self):
        self.k = torch.randn(1, 4, 64)


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 64)

    def forward(self, x, cache):
        cache.k = torch.cat([cache.k, x], dim=1)
        return (self.q(x) @ cache.k.transpose(1, 2)).softmax(-1)


def test_growing_state_with_symbolic_sizes_is_not_a_frozen_constant():
    """The decode graph of a dynamic KV cache: the cache tensor, symbolic in size, is a live
    input; only the parameters are folded (once): no refold, no rebuild, no compile per call."""
    from ember.backends.ember import STATS
    torch.manual_seed(0)
    m = Attend().eval().requires_grad_(False)
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    cache, ref_cache = Cache(), Cache()
    ref_cache.k = cache.k.clone()
    with torch.no_grad():
        for step in range(6):
            x = torch.randn(1, 1, 64)
            torch.testing.assert_close(c(x, cache), ref(x, ref_cache), **TOL)
            if step == 2:
                built = len(STATS)
    assert compiles() == 2 and len(STATS) == built          # no kernel compile per token
    assert count("frozen_graphs") == 2 and count("refolds") == 0
    assert count("instance_folds") == 0


def test_conv_argument_made_of_a_symbolic_size_keeps_the_captured_layout():
    """`dilation=[x.size(0)]` (PyTorch's test_convolution5) is a SymInt in the dynamic graph:
    the layout plan leaves that conv as captured instead of specializing it (int() raised)."""
    def f(x, w):
        return F.conv2d(x, w, dilation=[x.size(0)]).sum()
    w = torch.randn(1, 1, 5, 5)
    c = ember.compile(f)
    with torch.no_grad():
        for b in (2, 3, 2, 4):
            x = torch.randn(b, 1, 16 + 4 * b, 20 + 4 * b)
            torch.testing.assert_close(c(x, w), f(x, w), rtol=1e-4, atol=1e-3)
    assert count("channels_last_graphs") == 1     # only the first, static graph was planned
