"""The live progress line (TTY only, after a delay, erased at the end) and ember.stats()."""
from __future__ import annotations

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
