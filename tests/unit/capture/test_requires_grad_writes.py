"""Writes of `requires_grad` in traced code (attrs.set_requires_grad): a no-op write and a new
tensor's flag under no_grad stay in one graph; a write that changes the autograd graph
mid-trace is a graph break, with eager's values, flags and gradients either way."""
from __future__ import annotations

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
