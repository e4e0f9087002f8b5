"""Module-state snapshots (capture/statecheck.py): a compiled module tree that changes after its
first call is seen on the next call, through every route a user changes one, with no patch of
any torch class (ember coexists with torch.compile in one process)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember import capture
from ember.capture import statecheck

x = torch.randn(4, 6)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.act = nn.ReLU()
        self.scale = 2.0
        self.scales = [1.0, 3.0]

    def forward(self, t):
        return self.act(self.fc(t)) * self.scale * self.scales[1]


def _pair():
    torch.manual_seed(0)
    eager = Net()
    compiled = Net()
    compiled.load_state_dict(eager.state_dict())
    return eager, ember.compile(compiled, backend="eager")


def _same(eager, compiled, inp=x):
    torch.testing.assert_close(compiled(inp), eager(inp), rtol=0, atol=0)


MUTATIONS = {
    "float attribute": lambda m: setattr(m, "scale", 5.0),
    "list attribute item": lambda m: m.scales.__setitem__(1, -1.0),
    "submodule replaced": lambda m: setattr(m, "act", nn.Tanh()),
    "parameter replaced": lambda m: setattr(m.fc, "weight", nn.Parameter(torch.ones(5, 6))),
    "parameter put into _parameters": lambda m: m.fc._parameters.__setitem__(
        "bias", nn.Parameter(torch.full((5,), 0.5))),
    "forward hook added": lambda m: m.act.register_forward_hook(lambda mod, a, out: out + 1),
    "dtype via .double()": lambda m: m.double(),
    "storage swapped by param.data =": lambda m: setattr(m.fc.weight, "data", torch.zeros(5, 6)),
    "class changed": lambda m: setattr(m.act, "__class__", nn.Sigmoid),
    "__dict__ replaced": lambda m: setattr(m, "__dict__", {**m.__dict__, "scale": -2.0}),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutation_after_compile_is_seen(name):
    eager, compiled = _pair()
    _same(eager, compiled)
    assert capture.stats()["graphs"] == 1
    with torch.no_grad():
        MUTATIONS[name](eager)
        MUTATIONS[name](compiled)
    inp = x.double() if name == "dtype via .double()" else x
    _same(eager, compiled, inp)
    _same(eager, compiled, inp)


def test_hook_removed_and_eval_toggle_are_seen():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.Linear(6, 2))
    compiled = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.Linear(6, 2))
    compiled.load_state_dict(eager.state_dict())
    ember.compile(compiled, backend="eager")
    eager.eval(), compiled.eval()
    _same(eager, compiled)
    h1 = eager[0].register_forward_hook(lambda mod, a, out: out * 0)
    h2 = compiled[0].register_forward_hook(lambda mod, a, out: out * 0)
    _same(eager, compiled)
    h1.remove(), h2.remove()
    _same(eager, compiled)
    compiled.train()
    outs = {tuple(compiled(x).flatten().tolist()) for _ in range(4)}
    assert len(outs) > 1          # dropout is live again after .train()


def test_requires_grad_toggle_is_seen_in_training():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1))
    ref = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1))
    ref.load_state_dict(m.state_dict())
    ember.compile(m, backend="aot_eager")
    for frozen in (True, False, True):
        for model in (m, ref):
            model[0].weight.requires_grad_(not frozen)
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
        assert (m[0].weight.grad is None) == frozen
        if not frozen:
            torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad)
        torch.testing.assert_close(m[2].weight.grad, ref[2].weight.grad)


def test_channels_last_after_compile_with_kernels():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    compiled = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    compiled.load_state_dict(eager.state_dict())
    ember.compile(compiled)
    img = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(compiled(img), eager(img))
        compiled.to(memory_format=torch.channels_last)
        torch.testing.assert_close(compiled(img), eager(img))
        compiled.double()
        torch.testing.assert_close(compiled(img.double()), eager.double()(img.double()))


def test_steady_training_loop_does_not_refresh():
    """In-place updates (optimizer steps, BatchNorm running stats) change no snapshot: the
    structural guards run once, not once per step."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                      nn.Linear(4 * 6 * 6, 2))
    ember.compile(m, backend="aot_eager")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    img = torch.randn(2, 3, 8, 8)
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(m(img), torch.tensor([0, 1])).backward()
        opt.step()
    st = capture.stats()
    assert st["graphs"] == 1 and st.get("recompiles", 0) == 0
    assert st["refreshes"] == 1, st


def test_no_torch_class_is_patched():
    eager, compiled = _pair()
    compiled(x)
    compiled.scale = 3.0
    compiled(x)
    for cls in (nn.Module, torch.Tensor, nn.Parameter):
        for name, value in vars(cls).items():
            fn = getattr(value, "__func__", value)
            assert not getattr(fn, "__module__", "").startswith("ember"), (cls, name)
            assert not hasattr(fn, "_ember_bumps"), (cls, name)


def test_snapshot_sees_dict_tags_and_tensor_state():
    if statecheck._native() is None:
        pytest.skip("no C compiler: snapshots always report a change")
    m = nn.Linear(2, 2)
    snap = statecheck.snapshot([m], [m.weight, m.bias])
    assert snap() and snap()
    m.eval()                      # training True -> False: the module's __dict__ changes
    assert not snap()
    snap = statecheck.snapshot([m], [m.weight, m.bias])
    m.eval()                      # the same value again changes nothing
    assert snap()
    with torch.no_grad():
        m.weight.add_(1)          # in place: same storage
    assert snap()
    m.bias.requires_grad_(False)
    assert not snap()


def test_alternating_instances_keep_their_own_state():
    """One cache entry serves every instance of a class; each root keeps its own snapshot and
    inputs, so calls that alternate between instances re-check nothing."""
    blocks = [Net() for _ in range(3)]

    def step(block, t):
        return block(t)
    compiled = ember.compile(step, backend="eager")
    for _ in range(4):
        for b in blocks:
            torch.testing.assert_close(compiled(b, x), b(x), rtol=0, atol=0)
    st = capture.stats()
    assert st["graphs"] == 1 and st["refreshes"] == 3, st


def test_a_deleted_compiled_model_is_freed():
    import gc
    import weakref
    m = ember.compile(Net(), backend="eager")
    m(x)
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None


def test_tensor_layout_is_recognized():
    """With the pinned torch, every offset is found by the probe (else snapshots fall back to
    slower getters, or to checking every guard on every call)."""
    state = torch.get_rng_state()
    impl, storage, meta, flag = statecheck._layout()
    assert min(impl, storage, meta, flag) >= 0
    assert torch.equal(torch.get_rng_state(), state)     # probing draws no random numbers


class LazyCache(nn.Module):
    """A buffer rebuilt in forward when the input's length changes (timm ConViT's rel_indices,
    rotary-embedding caches): `self.buf = tensor` is Module.__setattr__ into _buffers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("table", torch.zeros(1, 1), persistent=False)

    def forward(self, t):
        n = t.shape[0]
        if self.table.shape[0] != n:
            self.table = torch.arange(n * 6, dtype=t.dtype).reshape(n, 6) / n
        return self.fc(t) + self.table


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_buffer_rebuilt_in_forward_stays_in_the_graph(backend):
    torch.manual_seed(0)
    eager, compiled = LazyCache(), LazyCache()
    compiled.load_state_dict(eager.state_dict())
    compiled = ember.compile(compiled, backend=backend, fullgraph=True)
    graphs = []
    for n in (4, 4, 4, 3, 3, 3, 4):
        t = torch.randn(n, 6)
        torch.testing.assert_close(compiled(t), eager(t))
        torch.testing.assert_close(compiled.table, eager.table, rtol=0, atol=0)
        assert "table" in compiled._buffers and "table" not in compiled.__dict__
        graphs.append(capture.stats()["graphs"])
    # a call that writes the buffer, then one that reads the new one: no graph after that
    # while the length stays
    assert graphs[1] == graphs[2] == 2 and graphs[4] == graphs[5]


def test_parameter_slot_assignment_breaks_the_graph():
    class SetParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, t):
            self.w = t * 2          # eager: TypeError (a tensor into a parameter slot)
            return t

    with pytest.raises((ember.Unsupported, TypeError)):
        ember.compile(SetParam(), backend="eager", fullgraph=True)(torch.randn(3))


class RegisterInForward(nn.Module):
    def __init__(self, route):
        super().__init__()
        self.route = route
        self.register_buffer("b", torch.zeros(3), persistent=False)

    def forward(self, t):
        if self.route == "register_buffer":
            self.register_buffer("b", t * 2, persistent=False)
        else:
            self._buffers["b"] = t * 2
        return self.b + 1           # reads the buffer just written, not the one before


@pytest.mark.parametrize("route", ["register_buffer", "_buffers item"])
def test_buffer_written_then_read_in_one_graph(route):
    eager, compiled = RegisterInForward(route), RegisterInForward(route)
    compiled = ember.compile(compiled, backend="ember", fullgraph=True)
    for _ in range(3):
        t = torch.randn(3)
        torch.testing.assert_close(compiled(t), eager(t), rtol=0, atol=0)
        torch.testing.assert_close(compiled.b, eager.b, rtol=0, atol=0)
    assert compiled._non_persistent_buffers_set == eager._non_persistent_buffers_set
    assert capture.stats()["graphs"] == 1
