"""Never slower than eager (ember/backends/speed.py): an inference graph whose kernels lose to
eager PyTorch on its real inputs runs eagerly from its second call on; the choice is cached on
disk; training graphs, input mutations and random ops are never timed; it can be switched off."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.backends import speed


@pytest.fixture(autouse=True)
def _speed_check_on(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_SPEED_CHECK", "1")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))


def _fn(x):
    return torch.sigmoid(x * 2 + 1).sum(dim=-1)


def _timings(kernels_ms, eager_ms, calls):
    def fake(kernels, eager, args):
        calls.append(1)
        return kernels_ms, eager_ms, kernels(*args)
    return fake


@pytest.mark.parametrize("kernels_ms,eager_ms,choice", [(2.0, 1.0, "eager"), (1.0, 2.0, "kernels"),
                                                        (1.02, 1.0, "kernels")])
def test_the_faster_path_serves_later_calls(monkeypatch, kernels_ms, eager_ms, choice):
    timed = []
    monkeypatch.setattr(speed, "_time_both", _timings(kernels_ms, eager_ms, timed))
    x = torch.randn(8, 32)
    f = ember.compile(_fn)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(f(x), _fn(x))
    assert len(timed) == 1 and [d["choice"] for d in speed.DECISIONS] == [choice]


def test_choice_is_cached_on_disk_and_logged(monkeypatch, caplog):
    import logging
    monkeypatch.setattr(speed, "_time_both", _timings(3.0, 1.0, []))
    x = torch.randn(4, 16)
    with torch.no_grad():
        f = ember.compile(_fn)
        f(x), f(x)
    ember.reset()

    def never(*a):
        raise AssertionError("timed again despite the disk cache")
    monkeypatch.setattr(speed, "_time_both", never)
    lg = speed.perf_log
    level, propagate = lg.level, lg.propagate
    lg.setLevel(logging.INFO)
    lg.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger=lg.name), torch.no_grad():
            g = ember.compile(_fn)
            g(x), g(x)
            torch.testing.assert_close(g(x), _fn(x))
    finally:
        lg.setLevel(level)
        lg.propagate = propagate
    assert [d["source"] for d in speed.DECISIONS] == ["disk cache"]
    assert any("kept on eager" in r.getMessage() for r in caplog.records)


def _train_step(m, x):
    return m(x).sum()


class Mutates(nn.Module):
    def forward(self, x, buf):
        buf.add_(1)
        return x * buf


CASES = {
    "training graph": (lambda: (nn.Linear(8, 8), torch.randn(2, 8)), False),
    "random op": (lambda: (nn.Dropout(0.5).train(), torch.randn(2, 8)), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_ineligible_graphs_are_never_timed(monkeypatch, name):
    monkeypatch.setattr(speed, "_time_both", _timings(9.0, 1.0, timed := []))
    make, no_grad = CASES[name]
    m, x = make()
    ember.compile(m)
    with torch.set_grad_enabled(not no_grad):
        for _ in range(3):
            m(x)
    assert timed == [] and speed.DECISIONS == []


def test_input_mutation_is_never_timed(monkeypatch):
    monkeypatch.setattr(speed, "_time_both", _timings(9.0, 1.0, timed := []))
    m, ref = ember.compile(Mutates()), Mutates()
    x, buf, buf_ref = torch.randn(4), torch.zeros(4), torch.zeros(4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(m(x, buf), ref(x, buf_ref))
    torch.testing.assert_close(buf, buf_ref)          # applied once per call, never more
    assert timed == []


def test_switched_off(monkeypatch):
    monkeypatch.setattr(speed, "_time_both", _timings(9.0, 1.0, timed := []))
    x = torch.randn(4, 16)
    f = ember.compile(_fn, options={"speed_check": False})
    with torch.no_grad():
        f(x), f(x), f(x)
    monkeypatch.setenv("EMBER_SPEED_CHECK", "0")
    g = ember.compile(lambda t: _fn(t) + 1)
    with torch.no_grad():
        g(x), g(x), g(x)
    assert timed == []


def test_real_timing_returns_correct_values():
    """Without faking the clock: both paths run on the second call; whichever wins, values are
    eager's."""
    x = torch.randn(64, 256)
    f = ember.compile(lambda t: F.layer_norm(t, (256,)).relu())
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), F.layer_norm(x, (256,)).relu())
    assert len(speed.DECISIONS) == 1 and speed.DECISIONS[0]["source"] == "timed"
