"""The compiled backward frees saved activations as it goes, as eager's autograd does: the
runtime releases autograd's references (ctx.maybe_clear_saved_tensors) and calls the backward
boxed, so the wrapper holds the last reference to each input and drops it after its last use."""
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember.bench.harness import peak_bytes


def _step(model, x):
    def run():
        for p in model.parameters():
            p.grad = None
        model(x).sum().backward()
    return run


@pytest.mark.parametrize("retain", [False, True])
def test_training_peak_memory_matches_eager(retain):
    torch.manual_seed(0)
    # wide activations, small weights: the peak is the saved activations, not the grads
    layers = []
    for _ in range(6):
        layers += [nn.Linear(64, 64), nn.Tanh()]
    eager = nn.Sequential(*layers)
    compiled = ember.compile(copy.deepcopy(eager))
    x = torch.randn(4096, 64)
    for m in (eager, compiled):
        _step(m, x)()
    e_peak, c_peak = peak_bytes(_step(eager, x)), peak_bytes(_step(compiled, x))
    assert c_peak <= 1.15 * e_peak, (c_peak, e_peak)
    if retain:      # the saved tensors stay for a second backward
        for m in (eager, compiled):
            for p in m.parameters():
                p.grad = None
        le, lc = eager(x).sum(), compiled(x).sum()
        le.backward(retain_graph=True)
        lc.backward(retain_graph=True)
        le.backward()
        lc.backward()
        for pe, pc in zip(eager.parameters(), compiled.parameters()):
            torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-5)
