"""Capture, lazy modules: a lazy module's first call inside a compiled frame makes its
parameters from the example shapes (as its pre-hook does eagerly), then the frame is traced
again over the module it became: one graph, the same parameters and outputs as eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember
from ember import capture


class LazyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.LazyLinear(8)
        self.relu = nn.ReLU()
        self.fc2 = nn.LazyLinear(3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _pair(make):
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    compiled = make()
    return eager, compiled


@pytest.mark.parametrize("make", [LazyMLP, lambda: nn.Sequential(nn.LazyConv2d(4, 3),
                                                                 nn.LazyBatchNorm2d())],
                         ids=["mlp", "conv_bn"])
def test_lazy_module_materialized_in_trace(make):
    x = torch.randn(2, 3, 6, 6) if make is not LazyMLP else torch.randn(5, 7)
    eager, compiled = _pair(make)
    fn = ember.compile(lambda m, t: m(t), backend="eager", fullgraph=True)
    state = torch.random.get_rng_state()
    out_c = fn(compiled, x)
    rng_after_compiled = torch.random.get_rng_state()
    torch.random.set_rng_state(state)
    out_e = eager(x)
    assert torch.equal(torch.random.get_rng_state(), rng_after_compiled)   # same init draws
    torch.testing.assert_close(out_c, out_e)
    assert type(compiled) is type(eager)
    for (n, p), (_, q) in zip(eager.named_parameters(), compiled.named_parameters()):
        assert type(p) is type(q) is nn.Parameter and p.shape == q.shape, n
        torch.testing.assert_close(p, q)
    torch.testing.assert_close(fn(compiled, x), eager(x))
    st = capture.stats()
    assert st.get("graphs", 0) == 1 and st.get("recompiles", 0) == 0, st


def test_lazy_module_reading_input_data_is_refused():
    class ReadsData(nn.modules.lazy.LazyModuleMixin, nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.UninitializedParameter()

        def initialize_parameters(self, x):
            self.w.materialize(x.shape)
            with torch.no_grad():
                self.w.copy_(x)                 # reads the input's data

        def forward(self, x):
            return x * self.w

    fn = ember.compile(lambda m, t: m(t), backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported, match="lazy module ReadsData"):
        fn(ReadsData(), torch.ones(3))
    m = ReadsData()
    out = ember.compile(lambda m, t: m(t), backend="eager")(m, torch.full((3,), 2.0))
    assert torch.equal(out, torch.full((3,), 4.0))       # ran eagerly: initialized from data
