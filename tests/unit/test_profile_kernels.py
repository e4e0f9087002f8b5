"""Generated kernels by name in torch.profiler tables: options={"profile": True} or
EMBER_PROFILE=1 wraps each kernel call in a record_function labelled with the kernel and the
graph nodes it computes; off by default (no label, no overhead). Values and grads as eager."""
from __future__ import annotations

import copy

import torch
from torch.profiler import profile

import ember


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.LayerNorm(48), torch.nn.GELU())


def _kernel_events(fn, x):
    with profile() as prof:
        fn(x).sum().backward()
    return [e.key for e in prof.key_averages() if e.key.startswith("ember kernel")]


def _check(compiled, eager):
    x = torch.randn(16, 32, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = compiled(x), eager(xe)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-5, atol=1e-5)
    return _kernel_events(compiled, x)


def test_profile_option_names_forward_and_backward_kernels():
    eager = _model()
    events = _check(ember.compile(copy.deepcopy(eager), options={"profile": True}), eager)
    # LayerNorm's forward and backward each run in kernels, labelled with their graph nodes
    assert len(events) >= 2
    assert all(":" in e for e in events), events


def test_profile_env_and_default_off(monkeypatch):
    eager = _model()
    assert _check(ember.compile(copy.deepcopy(eager)), eager) == []
    ember.reset()       # the env var is read when a graph compiles, not by cached frames
    monkeypatch.setenv("EMBER_PROFILE", "1")
    assert _check(ember.compile(copy.deepcopy(eager)), eager)
