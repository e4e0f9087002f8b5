"""The fallback policy, stage by stage: an internal error anywhere from capture to the C++ build
(including the backward, compiled lazily at the first backward) makes that graph run eagerly with
one warning naming the stage; values and gradients stay those of eager; EMBER_STRICT=1 raises."""
from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch

import ember
import ember.capture.entry as capture_entry
import ember.backends.ember as lower_compile
import ember.runtime.build as build
from ember.decomp import DECOMPS


class Boom(RuntimeError):
    pass


def _raise(*a, **k):
    raise Boom("injected failure")


def _lower_backward_only():
    real, calls = lower_compile.GraphLowering.run, []

    def run(self):
        calls.append(1)
        if len(calls) == 2:       # the forward is lowered at compile time, the backward later
            raise Boom("injected failure")
        return real(self)
    return run


INJECT = {
    "capture": (lambda mp: mp.setattr(capture_entry, "finalize", _raise), "internal error while capturing"),
    "aot": (lambda mp: mp.setattr(ember.aot, "partition", _raise), "failed in aot"),
    "decomp": (lambda mp: mp.setitem(DECOMPS, torch.ops.aten.gelu.default, _raise), "failed in decomp"),
    "lower": (lambda mp: mp.setattr(lower_compile.GraphLowering, "run", _raise), "failed in lower"),
    "codegen": (lambda mp: mp.setattr(lower_compile, "generate_tu", _raise), "failed in codegen"),
    "build": (lambda mp: mp.setattr(build, "CXX", "/nonexistent/g++"), "failed in build"),
    "backward": (lambda mp: mp.setattr(lower_compile.GraphLowering, "run", _lower_backward_only()),
                 "failed in lower.*backward"),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _step(m, x):
    out = m(x)
    out.pow(2).sum().backward()
    return out, [p.grad.clone() for p in m.parameters()]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))   # no graph/kernel cache hits
    ember.reset()
    yield
    ember.reset()


@pytest.mark.parametrize("where", list(INJECT))
def test_failure_in_stage_runs_eagerly_with_one_warning(where, fresh, monkeypatch):
    inject, message = INJECT[where]
    inject(monkeypatch)
    monkeypatch.setenv("EMBER_STRICT", "0")
    ref = _model()
    m = copy.deepcopy(ref)
    compiled = ember.compile(m)
    x = torch.randn(5, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, got_grads = _step(compiled, x)
        for p in m.parameters():
            p.grad = None
        _step(compiled, x)                     # the second call warns no more
    want, want_grads = _step(ref, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    mine = [str(w.message) for w in caught if "ember" in str(w.message)]
    assert len(mine) == 1, mine
    assert re.search(message, mine[0]), mine[0]
    assert "injected failure" in mine[0] or where == "build"
    assert ember.stats()["counts"].get("fallbacks", 0) >= 1


@pytest.mark.parametrize("where", ["capture", "lower", "build", "backward"])
def test_strict_mode_raises_instead(where, fresh, monkeypatch):
    INJECT[where][0](monkeypatch)
    monkeypatch.setenv("EMBER_STRICT", "1")
    compiled = ember.compile(_model())
    with pytest.raises(Exception, match="injected failure|not found|No such file"):
        _step(compiled, torch.randn(5, 8))
