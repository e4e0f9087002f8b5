"""Writes of `requires_grad` in traced code (attrs.set_requires_grad): a no-op write, a new
tensor's flag under no_grad and a new leaf that stays inside the graph stay in one graph; a leaf
the graph returns, one in a graph with no input that requires grad, and an input's flag are
graph breaks; eager's values, flags and gradients either way."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember


def counts():
    return ember.stats()["counts"]


def leaf_in_trace(x):
    z = torch.zeros_like(x).requires_grad_()          # HF MRA without its CUDA kernel
    y = x * 2 + z
    return y, z, z.requires_grad


def flag_by_attribute(x):
    h = x[:, None] * 1.5
    h.requires_grad = True                              # HF wav2vec2-style feature encoders
    return h.sin(), h


def test_new_tensor_flag_under_no_grad_is_one_graph():
    x = torch.randn(3, 4)
    for fn in (leaf_in_trace, flag_by_attribute):
        ember.reset()
        cf = ember.compile(fn, backend="aot_eager")
        for _ in range(2):
            with torch.no_grad():
                got, exp = cf(x), fn(x)
            for g, e in zip(got, exp):
                if isinstance(e, torch.Tensor):
                    torch.testing.assert_close(g, e)
                    assert (g.requires_grad, g.is_leaf) == (e.requires_grad, e.is_leaf), fn
                else:
                    assert g == e
        c = counts()
        assert (c.get("graphs"), c.get("graph_breaks", 0)) == (1, 0), c


def test_new_leaf_with_grad_enabled_breaks_and_gets_its_gradient():
    x = torch.randn(3, 4, requires_grad=True)
    cf = ember.compile(leaf_in_trace, backend="aot_eager")
    (gy, gz, gflag), (ey, ez, eflag) = cf(x), leaf_in_trace(x)
    torch.testing.assert_close(gy, ey)
    assert gflag == eflag and gz.is_leaf and gy.requires_grad
    (gy * ey.detach()).sum().backward()
    torch.testing.assert_close(gz.grad, ey.detach())
    assert counts().get("graph_breaks", 0) == 1, counts()


class FeatureEncoder(nn.Module):
    """HF SEW/Hubert/wav2vec2's feature encoder: `hidden_states.requires_grad = True` in training
    (for gradient checkpointing) on a view of the input, then convolutions."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 5, stride=2)
        self.norm = nn.GroupNorm(8, 8)
        self.proj = nn.Linear(8, 6)

    def forward(self, x):
        h = x[:, None]
        if self.training:
            h.requires_grad = True
        h = nn.functional.gelu(self.norm(self.conv(h)))
        z = torch.zeros_like(h).requires_grad_()        # a second leaf, used and dropped
        return self.proj((h + z).transpose(1, 2))


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_new_leaf_inside_a_training_graph_is_one_graph_with_eager_grads(backend):
    torch.manual_seed(0)
    m, ref = FeatureEncoder(), FeatureEncoder()
    ref.load_state_dict(m.state_dict())
    ember.compile(m, backend=backend)
    for _ in range(2):
        x = torch.randn(3, 40)
        got, exp = m(x), ref(x)
        torch.testing.assert_close(got, exp, atol=1e-5, rtol=1e-5)
        assert got.requires_grad and not got.is_leaf
        got.square().sum().backward()
        exp.square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)
    c = counts()
    assert (c.get("graphs"), c.get("graph_breaks", 0), c.get("fallbacks", 0)) == (1, 0, 0), c


def test_new_leaf_with_no_input_that_requires_grad_breaks_and_keeps_the_history():
    m, ref = FeatureEncoder(), FeatureEncoder()
    ref.load_state_dict(m.state_dict())
    m.requires_grad_(False)
    ref.requires_grad_(False)
    ember.compile(m, backend="aot_eager")
    x = torch.randn(3, 40)
    got, exp = m(x), ref(x)
    torch.testing.assert_close(got, exp)
    assert got.requires_grad and exp.requires_grad      # the leaf's history, as eager's
    assert counts().get("graph_breaks", 0) == 1, counts()


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.enc.requires_grad_(False)

    def forward(self, x):
        for p in self.enc.parameters():
            p.requires_grad = False                     # freezing code run on every call
        return self.head(self.enc(x).relu())


def test_rewriting_a_frozen_flag_is_no_break_and_training_matches():
    torch.manual_seed(0)
    m, ref = Frozen(), Frozen()
    ref.load_state_dict(m.state_dict())
    ember.compile(m, backend="aot_eager")
    x = torch.randn(5, 4)
    for _ in range(2):
        m(x).square().sum().backward()
        ref(x).square().sum().backward()
    assert m.enc.weight.grad is None and not m.enc.weight.requires_grad
    torch.testing.assert_close(m.head.weight.grad, ref.head.weight.grad)
    c = counts()
    assert (c.get("graphs"), c.get("graph_breaks", 0), c.get("recompiles", 0)) == (1, 0, 0), c
