"""MKL-packed linear weights in frozen inference graphs (ember/backends/prepack.py).

The GEMM library is pinned to MKL here (what gemmlib's probe picks where MKL's packed GEMM is
the faster, as on the Intel cores of 024/041); oneDNN's route: test_gemmlib.py.
Values vs eager at atol=rtol=1e-4 (float32): MKL's packed GEMM sums in another order than
addmm's, so results differ in rounding only."""
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends import freeze as fz
from ember.backends import gemmlib, prepack
from ember.backends.ember import STATS

TOL = dict(atol=1e-4, rtol=1e-4)
pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="no MKL")


@pytest.fixture(autouse=True)
def small_weights_packed(monkeypatch):
    monkeypatch.setattr(prepack, "MIN_WEIGHT", 1 << 15)       # keep the test's weights small
    monkeypatch.setattr(gemmlib, "measured", lambda: gemmlib.Choice("mkl", False, "test"))


class Conv1D(nn.Module):
    """GPT-2's linear: a [K, N] weight used through addmm (packed from its [N, K] view)."""

    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.05)
        self.bias = nn.Parameter(torch.randn(n) * 0.05)

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(
            *x.shape[:-1], -1)


def mlp(seed=0):
    """Packed at M < 4: the two wide linears (N >= 2K); at 4 <= M <= MAX_ROWS also the square
    one and the Conv1D (the last linear's weight is too small)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(128, 384), nn.GELU(), Conv1D(384, 128), nn.ReLU(),
                         nn.Linear(128, 300, bias=False), nn.Linear(300, 300),
                         nn.Linear(300, 4)).eval()


def count(name):
    return ember.stats()["counts"].get(name, 0)


def frozen_pair(**options):
    m = mlp()
    ref = copy.deepcopy(m)
    for p in m.parameters():
        p.requires_grad_(False)
    return ember.compile(m, options={"freeze": True, **options}), ref


def check(m, ref, x):
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x), **TOL)


def mkl_externs():
    return sum("mkl._mkl_linear.default" in s.get("fallbacks", ()) for s in STATS)


@pytest.mark.parametrize("shape", [(1, 128), (4, 128), (1, 1, 128), (2, 3, 128)])
def test_small_batch_linears_use_packed_weights(shape):
    m, ref = frozen_pair()
    x = torch.randn(*shape)
    check(m, ref, x)
    check(m, ref, x)
    rows = x.numel() // x.shape[-1]
    assert count("frozen_graphs") == 1
    assert count("prepacked_linears") == (4 if rows >= prepack.WIDE_ROWS else 2)
    assert mkl_externs() == 1


@pytest.mark.parametrize("shape", [(4, 128, 128), (prepack.MAX_ROWS, 128)])
def test_sequence_batches_use_packed_weights(shape):
    """A batch of sequences (M = 16..MAX_ROWS rows: 5-15% faster packed, docs/design/041),
    GPT-2's Conv1D included: values as eager, all four on MKL's packed GEMM."""
    m, ref = frozen_pair()
    x = torch.randn(*shape)
    check(m, ref, x)
    check(m, ref, x)
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 4
    assert mkl_externs() == 1


class ChannelsLastMLP(nn.Module):
    """torchvision Swin/ConvNeXt: linears on [B, H, W, C]; a bias computed from parameters
    (Swin v2's qkv bias with its k part zeroed)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(128, 384), nn.Linear(384, 128)

    def forward(self, x):
        b = self.fc1.bias.clone()
        b[128:256].zero_()
        return self.fc2(torch.nn.functional.linear(x, self.fc1.weight, b).relu())


def test_four_dim_inputs_and_computed_bias_packed():
    """Both linears are packed (before: a 4-D input was never packed, and a bias computed in
    the constant graph did not count as a constant); values as eager."""
    torch.manual_seed(0)
    m = ChannelsLastMLP().eval()
    ref = copy.deepcopy(m)
    c = ember.compile(m.requires_grad_(False))
    x = torch.randn(2, 7, 7, 128)
    check(c, ref, x)
    check(c, ref, x)
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 2
    with torch.no_grad():
        for mod in (m, ref):
            mod.fc1.bias.add_(0.5)
    check(c, ref, x)
    assert count("refolds") == 1


def test_large_batch_not_packed():
    m, ref = frozen_pair()
    check(m, ref, torch.randn(prepack.MAX_ROWS + 1, 128))
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 0


def test_other_batch_sizes_after_packing():
    """A recompile for another M (maybe dynamic, then not frozen) never reuses a pack for the
    wrong M; `_mkl_linear` itself falls back to a plain GEMM when M differs from the pack's."""
    m, ref = frozen_pair()
    for rows in (1, 3, 16, 1, 5):
        check(m, ref, torch.randn(rows, 128))
    assert count("prepacked_linears") >= 1


@pytest.mark.parametrize("rows", [2, 64])
@pytest.mark.parametrize("route", ["add_", "load_state_dict", "data_assign"])
def test_packed_weight_follows_weight_changes(route, rows):
    m, ref = frozen_pair()
    x = torch.randn(rows, 128)
    check(m, ref, x)
    other = mlp(seed=1)
    with torch.no_grad():
        if route == "add_":
            for mod in (m, ref):
                mod[0].weight.add_(0.5)
                mod[2].weight.mul_(-1.0)
        elif route == "load_state_dict":
            m.load_state_dict(other.state_dict())
            ref.load_state_dict(other.state_dict())
        else:
            m[4].weight.data = other[4].weight.data.clone()
            ref[4].weight.data = other[4].weight.data.clone()
    check(m, ref, x)
    check(m, ref, x)
    assert count("refolds") == 1 and count("prepacked_linears") == (2 if rows < 4 else 4)


def test_training_and_unfrozen_graphs_never_packed():
    m = mlp()
    ref = copy.deepcopy(m)
    c = ember.compile(m, options={"freeze": True})
    x = torch.randn(2, 128)
    torch.testing.assert_close(c(x), ref(x), **TOL)            # grad enabled: training graph
    c(x).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, **TOL)
    check(ember.compile(copy.deepcopy(ref), options={"freeze": False}), ref, x)
    assert count("frozen_graphs") == 0 and count("prepacked_linears") == 0


def test_prepack_option_and_memory_budget(monkeypatch):
    m, ref = frozen_pair(prepack=False)
    check(m, ref, torch.randn(2, 128))
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 0
    monkeypatch.setattr(fz, "MIN_BUDGET", 0)      # packs over budget: frozen, not packed
    m, ref = frozen_pair()
    check(m, ref, torch.randn(2, 128))
    assert count("frozen_graphs") == 2 and count("prepacked_linears") == 0
    m, ref = frozen_pair(prepack=True)            # True: packed whatever the budget
    check(m, ref, torch.randn(2, 128))
    assert count("frozen_graphs") == 3 and count("prepacked_linears") == 2


class Tied(nn.Module):
    """One weight in two linears (an LM head tied to the embedding): packed once."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 384)

    def forward(self, x):
        return self.fc(x) + torch.nn.functional.linear(x * 2, self.fc.weight)


def test_weight_used_twice_packed_once(monkeypatch):
    torch.manual_seed(0)
    m = Tied().eval()
    ref = copy.deepcopy(m)
    m.requires_grad_(False)
    packed = []

    def pack(w, rows):
        packed.append(w is m.fc.weight)
        return torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    monkeypatch.setattr(prepack, "MKL_PACK", pack)
    c = ember.compile(m, options={"freeze": True})
    check(c, ref, torch.randn(1, 128))
    assert count("prepacked_linears") == 2 and sum(packed) == 1


def test_budget_skips_only_what_does_not_fit(monkeypatch):
    """A linear whose pack does not fit is left unpacked; a smaller one after it is packed."""
    monkeypatch.setattr(fz, "MIN_BUDGET", 1 << 30)
    monkeypatch.setattr(prepack, "packed_bytes",
                        lambda n, k, m, lib: (700 if n == 1024 else 400) << 20)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(128, 384), nn.Linear(384, 1024), nn.Linear(1024, 2048)).eval()
    ref = copy.deepcopy(m)
    m.requires_grad_(False)
    c = ember.compile(m, options={"freeze": True})
    check(c, ref, torch.randn(1, 128))
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 2


def test_budget_counts_resident_bytes_of_packs(monkeypatch):
    """MKL reserves 2-5x a weight for its pack (the opaque tensor's numel) but touches about
    the weight's size: the budget counts `packed_bytes`, so packs that fit by resident size are
    made and the graph stays frozen (before, the reserved size put this one over budget)."""
    monkeypatch.setattr(fz, "MIN_BUDGET", 2 << 20)
    m, ref = frozen_pair()
    check(m, ref, torch.randn(64, 128))
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 4
    assert sum(torch.ops.mkl._mkl_reorder_linear_weight(w, 64).numel() * 4 for w in
               (ref[0].weight, ref[2].weight.t(), ref[4].weight, ref[5].weight)) > 2 << 20


class GatheredBias(nn.Module):
    """BEiT's attention: a relative-position bias gathered from a table by an index buffer
    (a constant the graph computes: new memory), and a linear whose weight may be packed."""

    def __init__(self, n=64, heads=4):
        super().__init__()
        self.table = nn.Parameter(torch.randn(2 * n, heads))
        self.register_buffer("index", torch.randint(0, 2 * n, (n * n,)))
        self.fc = nn.Linear(128, 384)
        self.n, self.heads = n, heads

    def forward(self, x):                                   # x: (B, n, 128)
        bias = self.table[self.index].view(self.n, self.n, self.heads).permute(2, 0, 1)
        y = self.fc(x)[..., :self.n]                         # (B, n, n)
        return y.unsqueeze(1) + bias.contiguous()


def test_budget_counts_constants_the_graph_computes(monkeypatch):
    """The packs get what the computed constants (65 KB here) leave of the budget: before, the
    pack (226 KB) was taken against the whole 250 KB, the total came out over it, and the
    graph was not frozen at all."""
    monkeypatch.setattr(fz, "MIN_BUDGET", 250_000)
    monkeypatch.setattr(fz, "BUDGET_FRACTION", 0.0)
    torch.manual_seed(0)
    m = GatheredBias().eval()
    ref = copy.deepcopy(m)
    c = ember.compile(m.requires_grad_(False))
    x = torch.randn(2, 64, 128)
    check(c, ref, x)
    check(c, ref, x)
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 0
