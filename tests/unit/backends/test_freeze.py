"""Freezing (ember/backends/freeze.py): parameters and buffers as constants in inference graphs.

Values are compared with eager at atol=rtol=1e-4 (float32): folding BatchNorm into the conv
weight changes rounding (the fold itself is computed in float64)."""
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends import freeze as fz

TOL = dict(atol=1e-4, rtol=1e-4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 6)
        self.bn3 = nn.BatchNorm1d(6)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y)) + y
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.bn3(self.fc(y))


def make(seed=0):
    torch.manual_seed(seed)
    m = Net()
    for mod in m.modules():           # non-trivial statistics, so a stale fold shows
        if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m.eval()


def count(name):
    return ember.stats()["counts"].get(name, 0)


def frozen_pair(**options):
    m = make()
    ref = copy.deepcopy(m)
    for p in m.parameters():
        p.requires_grad_(False)
    return ember.compile(m, options=options), ref


def check(m, ref, x):
    with torch.no_grad():
        out = m(x)
        torch.testing.assert_close(out, ref(x), **TOL)
    return out


def test_frozen_when_grad_off_and_params_frozen():
    m, ref = frozen_pair()
    x = torch.randn(2, 3, 10, 10)
    check(m, ref, x)
    check(m, ref, x)
    assert count("frozen_graphs") == 1


def test_frozen_when_params_require_grad(monkeypatch):
    """model.eval() under no_grad with trainable parameters: frozen too (the version checks
    keep it fresh); an optimizer step between evaluation epochs refolds (here a refold always
    pays: this net runs in microseconds), values equal eager."""
    monkeypatch.setattr(fz, "REFOLD_SHARE", 1e6)
    m = make()
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    x = torch.randn(2, 3, 10, 10)
    for _ in range(12):                   # an evaluation epoch: the fold pays
        check(c, ref, x)
    assert count("frozen_graphs") == 1
    xt = torch.randn(4, 3, 10, 10)
    for mod in (m, ref):
        mod.zero_grad()
        mod.train()(xt).sum().backward()
        torch.optim.SGD(mod.parameters(), lr=0.1).step()
        mod.eval()
    check(c, ref, x)
    assert count("refolds") == 1 and count("unfrozen_graphs") == 0


def test_trained_weights_changing_every_call_are_unfrozen(monkeypatch):
    """An evaluation on every training step (an RL policy acting between updates): once a
    refold costs more than REFOLD_SHARE of the run time since the last fold, the graph is
    compiled unfrozen for good; each call's values equal eager, the training grads too."""
    monkeypatch.setattr(fz, "REFOLD_SHARE", 0.0)      # any refold costs too much
    m = make()
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    opts = [torch.optim.SGD(mod.parameters(), lr=0.05) for mod in (m, ref)]
    x = torch.randn(2, 3, 10, 10)
    for step in range(4):
        check(c, ref, x)
        xt = torch.randn(4, 3, 10, 10)
        for mod, cm, opt in ((m, c, opts[0]), (ref, ref, opts[1])):
            opt.zero_grad()
            cm.train()(xt).square().mean().backward()
            opt.step()
            cm.eval()
        for (name, a), b in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **TOL, msg=name)
    assert count("frozen_graphs") == 1 and count("unfrozen_graphs") == 1
    assert count("refolds") == 0


def test_freeze_true_never_unfrozen(monkeypatch):
    monkeypatch.setattr(fz, "REFOLD_SHARE", 0.0)
    m = make()
    ref = copy.deepcopy(m)
    c = ember.compile(m, options={"freeze": True})
    x = torch.randn(2, 3, 10, 10)
    for _ in range(3):
        check(c, ref, x)
        with torch.no_grad():
            for mod in (m, ref):
                mod.conv1.weight.mul_(0.9)
    check(c, ref, x)
    assert count("refolds") == 3 and count("unfrozen_graphs") == 0


def test_batchnorm_folded_away():
    m = make()
    g = torch.fx.Graph()                  # the captured form: call_function conv2d, batch_norm
    x, w, rm, rv, bw, bb = (g.placeholder(n) for n in ("x", "w", "rm", "rv", "bw", "bb"))
    c = g.call_function(torch.conv2d, (x, w, None))
    b = g.call_function(torch.nn.functional.batch_norm, (c, rm, rv, bw, bb, False, 0.1, 1e-5))
    g.output(b)
    ex = [torch.randn(1, 3, 5, 5), m.conv1.weight.detach(), m.bn1.running_mean,
          m.bn1.running_var, m.bn1.weight.detach(), m.bn1.bias.detach()]
    for n, v in zip(g.nodes, ex):
        n.meta["example_value"] = v
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    want = gm(*ex)
    consts = {n for n in g.nodes if n.op == "placeholder" and n.name != "x"}
    assert fz.fold_batchnorm(gm, consts) == 1
    gm.recompile()
    assert not any(n.target is torch.nn.functional.batch_norm for n in g.nodes)
    torch.testing.assert_close(gm(*ex), want, **TOL)


@pytest.mark.parametrize("route", ["optimizer", "load_state_dict", "copy_", "to_channels_last",
                                   "data_assign", "new_parameter", "double"])
def test_weight_changed_after_freezing_is_never_stale(route):
    m, ref = frozen_pair(freeze=True)
    x = torch.randn(2, 3, 10, 10)
    check(m, ref, x)
    other = make(seed=1)
    with torch.no_grad():
        if route == "optimizer":
            for mod in (m, ref):
                for p in mod.parameters():        # a frozen param may still be stepped
                    p.grad = torch.ones_like(p)
                torch.optim.SGD(mod.parameters(), lr=0.1).step()
        elif route == "load_state_dict":
            m.load_state_dict(other.state_dict())
            ref.load_state_dict(other.state_dict())
        elif route == "copy_":
            for mod in (m, ref):
                mod.conv2.weight.copy_(other.conv2.weight)
                mod.bn2.running_var.copy_(other.bn2.running_var)
        elif route == "to_channels_last":
            m.to(memory_format=torch.channels_last)
            ref.to(memory_format=torch.channels_last)
            for mod in (m, ref):           # and a new value, so staleness would show
                mod.bn1.running_mean.add_(1)
        elif route == "data_assign":
            m.conv1.weight.data = other.conv1.weight.data.clone()
            ref.conv1.weight.data = other.conv1.weight.data.clone()
        elif route == "new_parameter":
            m.conv1.weight = nn.Parameter(other.conv1.weight.clone(), requires_grad=False)
            ref.conv1.weight = nn.Parameter(other.conv1.weight.clone())
        elif route == "double":
            m.double()
            ref.double()
            x = x.double()
    check(m, ref, x)
    check(m, ref, x)
    assert count("frozen_graphs") >= 1


def test_frozen_runtime_refolds_without_recompiling():
    m, ref = frozen_pair(freeze=True)
    x = torch.randn(2, 3, 10, 10)
    check(m, ref, x)
    graphs = count("graphs")
    for step in range(3):
        with torch.no_grad():
            m.bn1.running_mean.add_(0.5)
            ref.bn1.running_mean.add_(0.5)
        check(m, ref, x)
    assert count("refolds") == 3 and count("graphs") == graphs


def test_training_after_inference_call_unaffected():
    torch.manual_seed(0)
    m = make().train()
    ref = copy.deepcopy(m)
    m = ember.compile(m, options={"freeze": True})
    x = torch.randn(4, 3, 10, 10)
    m.eval()
    ref.eval()
    check(m, ref, x)
    assert count("frozen_graphs") == 1
    m.train()
    ref.train()
    for mod in (m, ref):
        mod.zero_grad()
        mod(x).sum().backward()
    for (name, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOL, msg=name)
    for (name, a), b in zip(m.named_buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, **TOL, msg=name)
    assert count("frozen_graphs") == 1
    check(m.eval(), ref.eval(), x)              # back to inference: BN stats moved → refold


def test_freeze_false_option_and_training_graph_refused():
    m, ref = frozen_pair(freeze=False)
    check(m, ref, torch.randn(2, 3, 10, 10))
    assert count("frozen_graphs") == 0
    assert fz.wants_freeze(torch.fx.symbolic_trace(nn.Identity()), {"freeze": True},
                           [nn.Parameter(torch.ones(2))], [0]) == "a training graph"


def test_memory_budget(monkeypatch):
    monkeypatch.setattr(fz, "MIN_BUDGET", 0)
    monkeypatch.setattr(fz, "BUDGET_FRACTION", 0.01)     # any folded copy is over budget
    m, ref = frozen_pair(freeze=True)
    check(m, ref, torch.randn(2, 3, 10, 10))
    assert count("frozen_graphs") == 0


def test_batchnorm_folded_per_call_when_not_frozen():
    """An inference graph not frozen (options freeze=False; also once trained weights change
    too often): BatchNorm is folded into the conv inside the graph, each call, where the
    conv's output outweighs its weight; every change to the weights or statistics shows at
    the next call."""
    m = make()
    ref = copy.deepcopy(m)
    c = ember.compile(m, options={"freeze": False})
    x = torch.randn(2, 3, 8, 8)
    check(c, ref, x)
    assert count("batchnorm_folded_per_call") == 2        # the convs; the linear's output
    assert count("frozen_graphs") == 0                      # (2x6) is smaller than its weight
    with torch.no_grad():
        for mod in (m, ref):
            mod.bn1.running_var.mul_(3.0)
            mod.conv2.weight.add_(0.1)
            mod.bn2.weight.mul_(-1.0)
    check(c, ref, x)
    assert count("graphs") == 1
    m.train()
    ref.train()                                            # training BN: batch statistics
    torch.testing.assert_close(c(x), ref(x), **TOL)


def test_batchnorm_not_folded_per_call_in_training_graphs():
    m = make()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(ember.compile(m)(x), ref(x), **TOL)   # eval BN, grad enabled
    assert count("batchnorm_folded_per_call") == 0


class Cached(nn.Module):
    """A buffer the graph writes each call (a KV cache): not a constant; the weights are."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(4))

    def forward(self, x):
        self.cache.add_(x.sum(0))
        return self.fc(x) + self.cache


def test_buffer_written_in_place_is_not_frozen():
    torch.manual_seed(0)
    m = Cached().eval()
    ref = copy.deepcopy(m)
    m.requires_grad_(False)
    c = ember.compile(m, options={"freeze": True})
    x = torch.randn(2, 4)
    for _ in range(3):
        check(c, ref, x)
    torch.testing.assert_close(m.cache, ref.cache)
    assert count("frozen_graphs") == 1 and count("refolds") == 0


class InPlaceBlock(nn.Module):
    """ResNet's writes into activations: relu(inplace=True) on a BN output, `out += identity`."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        out = torch.nn.functional.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += x
        return torch.nn.functional.relu(out, inplace=True)


def test_writes_into_activations_keep_the_weights_constant():
    """A write into a tensor computed from the weights (not a view of them) writes no weight:
    both BatchNorms are folded (before, every input behind an in-place relu counted as
    written, and a frozen ResNet folded 3 of its 20 BatchNorms)."""
    torch.manual_seed(0)
    m = InPlaceBlock()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_var.uniform_(0.5, 2)
    m.eval()
    ref = copy.deepcopy(m)
    c = ember.compile(m.requires_grad_(False))
    x = torch.randn(2, 8, 6, 6)
    check(c, ref, x)
    with torch.no_grad():
        for mod in (m, ref):
            mod.bn2.running_mean.add_(0.5)
    check(c, ref, x)
    assert count("frozen_graphs") == 1 and count("refolds") == 1
    assert fz.written_inputs(_captured(ref, x)) == set()


def _captured(m, x):
    got = {}

    def backend(gm, example_inputs):
        got["gm"] = gm
        return gm.forward
    with torch.no_grad():
        ember.compile(copy.deepcopy(m), backend=backend)(x)
    return got["gm"]


def test_write_through_a_view_of_a_buffer_is_seen():
    """A write into a view of a buffer writes the buffer: not a constant."""
    def f(buf, x):
        buf.view(-1)[:2].add_(x.sum())
        return x * buf

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.ones(2, 2))

        def forward(self, x):
            return f(self.buf, x)
    m = M()
    gm = _captured(m, torch.randn(2, 2))
    written = fz.written_inputs(gm)
    assert len(written) == 1 and "buf" in next(iter(written)).name


@pytest.mark.parametrize("route", ["add_", "load_state_dict", "data_assign"])
def test_prepacked_conv_weights_are_repacked(route):
    """Frozen conv weights are reordered once into oneDNN's blocked layout (the weight as the
    user holds it, and one folded with its BatchNorm): a weight changed afterwards is
    repacked at the next call, never used stale; values within 1e-4 of eager."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1),
                        nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3, stride=2)).eval()
    m = copy.deepcopy(ref).requires_grad_(False)
    c = ember.compile(m)
    x = torch.randn(2, 3, 12, 12)
    check(c, ref, x)
    assert count("frozen_graphs") == 1 and count("prepacked_convs") == 3
    other = copy.deepcopy(ref)
    with torch.no_grad():
        other[0].weight.mul_(-2)
        other[3].running_var.mul_(4)
        other[4].weight.add_(1)
        for mod in (m, ref):
            if route == "add_":
                mod[0].weight.mul_(-2)
                mod[3].running_var.mul_(4)
                mod[4].weight.add_(1)
            elif route == "load_state_dict":
                mod.load_state_dict(other.state_dict())
            else:
                mod[4].weight.data = other[4].weight.data.clone()
    check(c, ref, x)
    check(c, ref, x)
    assert count("refolds") == 1 and count("graphs") == 1


def test_prepack_false_packs_no_conv():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    c = ember.compile(copy.deepcopy(ref).requires_grad_(False), options={"prepack": False})
    check(c, ref, torch.randn(2, 3, 6, 6))
    assert count("frozen_graphs") == 1 and count("prepacked_convs") == 0


def test_instances_of_one_class_keep_their_own_folds(monkeypatch):
    """Two instances of one model class compiled apart share the captured graph; calls
    alternating between them swap folds instead of refolding (weights requiring grad: before,
    the refolds put the graph unfrozen for good). A weight changed in one instance while the
    other runs is still seen (its fold's stamp no longer matches)."""
    monkeypatch.setattr(fz, "REFOLD_SHARE", 0.0)      # any refold would unfreeze
    a, b = make(seed=0), make(seed=1)
    ref_a, ref_b = copy.deepcopy(a), copy.deepcopy(b)
    ca, cb = ember.compile(a), ember.compile(b)
    x = torch.randn(2, 3, 10, 10)
    for _ in range(3):
        check(ca, ref_a, x)
        check(cb, ref_b, x)
    assert count("frozen_graphs") == 1 and count("instance_folds") == 1
    assert count("refolds") == 0 and count("unfrozen_graphs") == 0
    with torch.no_grad():
        for mod in (b, ref_b):
            mod.bn2.running_mean.add_(1.0)
    check(ca, ref_a, x)
    check(cb, ref_b, x)
    assert count("refolds") == 0 and count("instance_folds") == 2


class MaskedQKVBias(nn.Module):
    """Swin v2's attention: the qkv bias is cloned and its k part zeroed on every call, an
    in-place write into a copy of a parameter (before, the graph was not frozen at all)."""

    def __init__(self, c=64):
        super().__init__()
        self.qkv = nn.Linear(c, 3 * c)
        self.c = c

    def forward(self, x):
        b = self.qkv.bias.clone()
        b[self.c:2 * self.c].zero_()
        return torch.nn.functional.linear(x, self.qkv.weight, b).relu()


def test_write_into_a_copy_of_a_parameter_is_folded():
    """clone + zero_ on the copy run in the constant graph: the graph is frozen, the
    parameter is untouched, values equal eager, and a changed bias is refolded."""
    torch.manual_seed(0)
    m = MaskedQKVBias().eval()
    ref = copy.deepcopy(m)
    c = ember.compile(m.requires_grad_(False))
    x = torch.randn(2, 49, 64)
    check(c, ref, x)
    assert count("frozen_graphs") == 1
    torch.testing.assert_close(m.qkv.bias, ref.qkv.bias, rtol=0, atol=0)  # not written
    with torch.no_grad():
        for mod in (m, ref):
            mod.qkv.bias.add_(0.5)
    check(c, ref, x)
    assert count("refolds") == 1
    gm = _captured(ref, x)
    const = fz.constant_nodes(gm, {n for n in gm.graph.nodes if n.op == "placeholder" and
                                   ("bias" in n.name or "weight" in n.name)})
    assert any(n.op != "placeholder" and fz.layout.writes_in_place(n) for n in const)


def test_copy_read_before_the_write_is_not_folded_stale():
    """A copy the main graph reads before the write cannot take the write into the constant
    graph (the main graph would see the written values): not frozen, and still right."""
    class M(MaskedQKVBias):
        def forward(self, x):
            b = self.qkv.bias.clone()
            y = x[..., :1] * b
            b[self.c:2 * self.c].zero_()
            return y + torch.nn.functional.linear(x, self.qkv.weight, b)
    torch.manual_seed(0)
    m = M().eval()
    ref = copy.deepcopy(m)
    c = ember.compile(m.requires_grad_(False))
    for _ in range(2):
        check(c, ref, torch.randn(2, 49, 64))
    assert count("frozen_graphs") == 0


class PreActivation(nn.Module):
    """BatchNorms that read no conv/linear: DenseNet's BN-ReLU-conv (NCHW, channels-last),
    BatchNorm1d over (N, C, L) and over LeViT's flattened linear output."""

    def __init__(self):
        super().__init__()
        self.bn0, self.conv = nn.BatchNorm2d(3), nn.Conv2d(3, 8, 3, padding=1)
        self.bn1, self.fc, self.bn2 = nn.BatchNorm1d(8), nn.Linear(8, 6, bias=False), \
            nn.BatchNorm1d(6)

    def forward(self, x):
        y = self.conv(torch.relu(self.bn0(x)))
        y = self.bn1(y.flatten(2)).transpose(1, 2)           # (N, C, L)
        z = self.fc(y)
        return self.bn2(z.flatten(0, 1)).reshape_as(z)


def test_batchnorm_without_conv_becomes_affine_in_frozen_graphs():
    """Each becomes x * scale + shift with scale/shift folded once; values as eager (1e-4),
    in both layouts, and a changed running_var is refolded."""
    torch.manual_seed(0)
    m = PreActivation()
    for mod in m.modules():
        if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
            mod.weight.data.uniform_(0.5, 1.5)
    m.eval()
    ref = copy.deepcopy(m)
    c = ember.compile(m.requires_grad_(False))
    x = torch.randn(2, 3, 6, 6)
    check(c, ref, x)
    check(c, ref, x.contiguous(memory_format=torch.channels_last))
    assert count("batchnorms_as_affine") >= 3
    with torch.no_grad():
        for mod in (m, ref):
            mod.bn0.running_var.mul_(3.0)
            mod.bn2.running_mean.add_(1.0)
    check(c, ref, x)
    assert count("refolds") >= 1


def _frozen_runtime():
    from ember.capture import entry
    rts = [e.run.__globals__.get("__compiled") for c in entry.CACHES.values() for e in c.entries]
    rts = [r for r in rts if isinstance(r, fz.FrozenRuntime)]
    assert len(rts) == 1
    return rts[0]


@pytest.mark.parametrize("route", ["version", "data_pointer", "identity", "another_instance"])
def test_straight_line_call_path_sees_every_change(route):
    """After its first call a frozen graph runs generated straight-line code (FrozenRuntime._arm:
    each constant's identity, version and data pointer compared, then the main graph called).
    A change by each route after many such calls is still seen: values equal eager's, the
    change refolds (or swaps in the other instance's fold), and the path is re-armed with the
    new tensors."""
    def pair():                 # instances compiled with the same settings share a graph
        m = make()
        ref = copy.deepcopy(m)
        return ember.compile(m.requires_grad_(False)), ref
    m, ref = pair()
    x = torch.randn(2, 3, 10, 10)
    for _ in range(5):
        check(m, ref, x)
    rt = _frozen_runtime()
    assert rt.run.__name__ == "run" and rt.run.__code__.co_filename == "<ember frozen call>"
    held = rt.held
    other = make(seed=1)
    with torch.no_grad():
        if route == "version":
            for mod in (m, ref):
                mod.bn2.running_var.mul_(2)
        elif route == "data_pointer":
            m.conv2.weight.data = other.conv2.weight.data.clone()
            ref.conv2.weight.data = other.conv2.weight.data.clone()
        elif route == "identity":
            m.fc.weight = nn.Parameter(other.fc.weight.clone(), requires_grad=False)
            ref.fc.weight = nn.Parameter(other.fc.weight.clone())
        else:
            m, ref = pair()
            with torch.no_grad():
                for mod in (m, ref):
                    mod.bn1.running_mean.add_(1)
    for _ in range(3):
        check(m, ref, x)
    assert rt.run.__code__.co_filename == "<ember frozen call>"
    assert rt.held is not held or route == "version"
    assert count("refolds") + count("instance_folds") == 1


def test_straight_line_call_path_times_trained_weights(monkeypatch):
    """Weights requiring grad: the straight-line path counts the main graph's calls and run
    time, which decide whether a refold pays (REFOLD_SHARE)."""
    m = make()
    ref = copy.deepcopy(m)
    c = ember.compile(m)
    x = torch.randn(2, 3, 10, 10)
    for _ in range(2):
        check(c, ref, x)
    rt = _frozen_runtime()
    calls, run_s = rt.calls, rt.run_s
    for _ in range(5):
        check(c, ref, x)
    assert rt.calls == calls + 5 and rt.run_s > run_s
