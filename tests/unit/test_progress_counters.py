"""The live progress line (TTY only, after a delay, erased at the end) and ember.stats()."""
from __future__ import annotations

import copy
import io
import time

import torch

import ember
from ember import progress


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_only_on_tty_after_delay(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.05)
    tty = FakeTTY()
    with progress.compiling(tty):
        progress.stage("codegen")
        time.sleep(0.4)
    out = tty.getvalue()
    assert "ember: compiling graph" in out and "codegen" in out
    assert out.endswith("\r\033[K")  # the line is erased at the end

    pipe = io.StringIO()  # not a TTY: silent
    with progress.compiling(pipe):
        time.sleep(0.2)
    assert pipe.getvalue() == ""


def test_progress_disabled_by_env(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.01)
    monkeypatch.setenv("EMBER_PROGRESS", "0")
    tty = FakeTTY()
    with progress.compiling(tty):
        time.sleep(0.1)
    assert tty.getvalue() == ""


def test_stats_count_fallbacks(monkeypatch):
    monkeypatch.setenv("EMBER_STRICT", "0")

    def broken(gm, example_inputs):
        raise RuntimeError("nope")

    ember.register_backend("test-broken-stats", broken)
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ember.get_backend("test-broken-stats")(gm, [torch.randn(2)])
    s = ember.stats()
    assert s["counts"]["fallbacks"] == 1
    assert "backend:test-broken-stats" in s["compile_seconds"]
    ember.reset()
    assert ember.stats()["counts"] == {}


def test_timed_blocks_nest_exclusively():
    import time
    from ember import counters
    counters.clear()
    with counters.timed("outer"):
        time.sleep(0.02)
        with counters.timed("inner"):
            time.sleep(0.05)
    sec = counters.snapshot()["compile_seconds"]
    assert 0.045 <= sec["inner"] < 0.2
    assert 0.015 <= sec["outer"] < 0.045          # its own 20 ms, not the inner 50 ms


def test_stats_count_graphs_recompiles_and_stage_seconds():
    ember.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    ref = copy.deepcopy(m)
    c = ember.compile(m, dynamic=False)
    for n in (2, 3, 3):
        x = torch.randn(n, 8)
        torch.testing.assert_close(c(x), ref(x))
    s = ember.stats()
    assert s["counts"]["graphs"] == 2 and s["counts"]["recompiles"] == 1, s
    assert s["counts"]["kernel_graphs"] == 2 and s["counts"]["kernels"] >= 2, s
    assert s["compile_seconds"]["aot"] > 0 and s["compile_seconds"]["codegen"] > 0, s
    ember.reset()
    assert ember.stats()["counts"] == {}
