"""`module.to(...)` / `.float()` inside a traced forward (transformers' Switch/NLLB-MoE routers
cast their classifier on every call): a cast that changes nothing is the module itself, in one
graph; one that would change a parameter breaks and runs eagerly, as eager converts it."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import ember


class Router(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.classifier = nn.Linear(8, 4)
        self.side = nn.Linear(8, 8)               # cast but unused: still guarded
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.dtype, self.how = torch.float32, how

    def forward(self, x):
        if self.how == "to":
            self.classifier = self.classifier.to(self.dtype)
        elif self.how == "float":
            self.classifier = self.classifier.float()
        else:
            self.side.to(device="cpu", dtype=self.dtype)
        return self.classifier(x.to(self.dtype)).softmax(-1)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize("how", ["to", "float", "kwargs"])
def test_noop_module_cast_in_one_graph(how, backend):
    ember.reset()
    ref = Router(how)
    m = copy.deepcopy(ref)
    ember.compile(m, backend=backend, fullgraph=True)
    x = torch.randn(3, 8)
    for _ in range(2):
        torch.testing.assert_close(m(x), ref(x), rtol=1e-6, atol=1e-6)
    m(x).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(m.classifier.weight.grad, ref.classifier.weight.grad,
                               rtol=1e-6, atol=1e-6)
    assert m.classifier is not None and type(m.classifier) is nn.Linear
    st = ember.stats()["counts"]
    assert st.get("graphs") == 1 and not st.get("graph_breaks") and not st.get("recompiles"), st


@pytest.mark.parametrize("how", ["to", "float"])
def test_module_cast_that_converts_runs_eagerly(how):
    """Compiled while the cast was a no-op; after `.double()` the cast converts back to float32:
    the guards fail, the retrace refuses the cast, and the module ends as eager leaves it."""
    ember.reset()
    ref = Router(how)
    m = copy.deepcopy(ref)
    ember.compile(m, backend="aot_eager")
    x = torch.randn(3, 8)
    m(x)
    ref(x)
    m.double()
    ref.double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = m(x)
    torch.testing.assert_close(got, ref(x), rtol=1e-6, atol=1e-6)
    for a, b in zip(m.parameters(), ref.parameters()):
        assert a.dtype == b.dtype
    st = ember.stats()["counts"]
    assert st.get("graph_breaks", 0) >= 1, st
