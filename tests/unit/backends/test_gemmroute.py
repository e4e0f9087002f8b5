"""Unfrozen GEMMs (training forward and backward, inference without freezing) on oneDNN's linear
(ember/backends/gemmroute.py, lower/rules_data._onednn_gemm; docs/design/076).

Values and gradients vs eager at atol=rtol=1e-4 (float32; oneDNN sums in another order than
MKL's sgemm, so results differ in rounding only). The probe's verdict is fixed by the test
(gemmlib.measured), and MIN_WORK lowered so that small, odd sizes take the route."""
import logging

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends import ember as ember_backend, gemmlib, prepack

TOL = dict(atol=1e-4, rtol=1e-4)
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
WORK = 16 * 37 * 29             # the smallest GEMM the tests route
WRAPPERS = []                   # the wrapper source of each graph compiled in the test


class Recording(ember_backend.WrapperCodegen):
    def generate(self):
        WRAPPERS.append(super().generate())
        return WRAPPERS[-1]


@pytest.fixture(autouse=True)
def onednn_wins(monkeypatch, tmp_path):
    # a fresh cache: a graph-cache hit (an earlier run's entry) skips the lowering and the
    # wrapper these tests count
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prepack, "MIN_WORK", WORK)
    monkeypatch.setattr(gemmlib, "measured", lambda: gemmlib.Choice("onednn", True, "test"))
    monkeypatch.setattr(ember_backend, "WrapperCodegen", Recording)
    WRAPPERS.clear()


def count():
    return ember.stats()["counts"].get("onednn_gemms", 0)


def externs(name):
    """How many times the compiled graphs' wrappers call `name` (counted in their source)."""
    return sum(src.count(name) for src in WRAPPERS)


class MLP(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(53, 37, bias=bias), nn.Linear(37, 29, bias=bias)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def train_step(m, x):
    """Output, input gradient and parameter gradients of one backward of (out * g).sum()."""
    x = x.detach().requires_grad_(True)
    out = m(x)
    g = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * g).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


def assert_step_matches(m, x, **options):
    ref = train_step(m, x)
    got = train_step(ember.compile(m, options=options), x)
    torch.testing.assert_close(got[0], ref[0], **TOL)
    torch.testing.assert_close(got[1], ref[1], **TOL)
    for a, b in zip(got[2], ref[2]):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(19, 53), (2, 9, 53), (3, 2, 5, 53)])
def test_training_gemms_on_onednn_match_eager(shape, bias):
    """2-D to 4-D inputs (flattened to 19-30 rows), bias or none: the forward's two linears
    and the backward's two input gradients (g @ W, W read transposed in place) run on oneDNN;
    the weight gradients (g.t() @ x, a transposed first operand) stay on aten."""
    torch.manual_seed(0)
    assert_step_matches(MLP(bias), torch.randn(*shape))
    assert count() == 4
    assert externs("mkldnn__linear_pointwise") == 4
    assert externs("torch.mm(") == 2                # the weight gradients


class Conv1D(nn.Module):
    """GPT-2's linear: addmm(b, x, w) with a [K, N] weight; its weight gradient is x.t() @ g."""
    def __init__(self, k, n):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(k, n) * 0.1), nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(
            *x.shape[:-1], -1)


@pytest.mark.parametrize("shape", [(19, 53), (2, 9, 53)])
def test_weight_gradients_with_wide_outputs_on_onednn(monkeypatch, shape):
    """A weight gradient (first operand column-major) with at least TRANSPOSED_MIN_N output
    columns runs on oneDNN (fc1's: 37 x 53, and the Conv1D's x.t() @ g: 53 x 61); one under
    it (fc2's: 29 x 37) stays aten. Values and gradients vs eager."""
    from ember.backends import gemmroute
    monkeypatch.setattr(gemmroute, "TRANSPOSED_MIN_N", 53)
    torch.manual_seed(0)
    assert_step_matches(MLP(), torch.randn(*shape))
    assert count() == 5
    assert externs("mkldnn__linear_pointwise") == 5 and externs("torch.mm(") == 1
    ember.reset()
    WRAPPERS.clear()
    torch.manual_seed(0)
    assert_step_matches(nn.Sequential(Conv1D(53, 61), nn.Tanh()), torch.randn(*shape))
    # forward, input gradient g @ w.t(), weight gradient x.t() @ g (61 wide)
    assert count() == 3 and externs("torch.mm(") == 0


def test_onednn_gemm_reads_transposed_weights_without_a_copy():
    """x @ w.t() and x @ w (w [N, K] / [K, N] graph inputs): no kernel copies an operand; a
    transposed first operand stays an aten mm."""
    torch.manual_seed(0)
    x, w, wk, xt = torch.randn(41, 53), torch.randn(37, 53), torch.randn(53, 37), torch.randn(53, 41)

    def f(x, w, wk, xt):
        return torch.mm(x, w.t()), torch.mm(x, wk), torch.mm(xt.t(), wk)

    got = ember.compile(f)(x, w, wk, xt)
    for a, b in zip(got, f(x, w, wk, xt)):
        torch.testing.assert_close(a, b, **TOL)
    assert count() == 2 and externs("torch.mm(") == 1
    assert sum(s["kernels"] for s in ember_backend.STATS) == 0


def test_addmm_forms_oneDNN_does_not_take_stay_aten():
    """beta/alpha other than 1, and a bias per element of the output: aten's addmm."""
    torch.manual_seed(0)
    b1, b2, x, w = torch.randn(37), torch.randn(41, 37), torch.randn(41, 53), torch.randn(53, 37)

    def f(b1, b2, x, w):
        return (torch.addmm(b1, x, w), torch.addmm(b1, x, w, beta=0.5, alpha=2.0),
                torch.addmm(b2, x, w))

    got = ember.compile(f)(b1, b2, x, w)
    for a, b in zip(got, f(b1, b2, x, w)):
        torch.testing.assert_close(a, b, **TOL)
    assert count() == 1 and externs("torch.addmm(") == 2


BIG = 1 << 60


@pytest.mark.parametrize("rows, work, weight, routed", [
    (prepack.PLAIN_ROWS, prepack.PLAIN_ROWS * 53 * 37, BIG, True),
    (prepack.PLAIN_ROWS - 1, 1, 1, False),
    (prepack.PLAIN_ROWS, prepack.PLAIN_ROWS * 53 * 37 + 1, BIG, False),
    (prepack.PLAIN_ROWS, BIG, 53 * 37, True), (prepack.PLAIN_ROWS, BIG, 53 * 37 + 1, False)])
def test_size_rule(monkeypatch, rows, work, weight, routed):
    """Frozen linears' rule for the plain weight (prepack.plain_pays): at least PLAIN_ROWS rows,
    and MIN_WORK multiply-adds or PLAIN_MIN_WEIGHT weight elements (oneDNN's fixed cost), else
    aten."""
    monkeypatch.setattr(prepack, "MIN_WORK", work)
    monkeypatch.setattr(prepack, "PLAIN_MIN_WEIGHT", weight)
    torch.manual_seed(0)
    x, w = torch.randn(rows, 53), torch.randn(53, 37)
    torch.testing.assert_close(ember.compile(torch.mm)(x, w), x @ w, **TOL)
    assert count() == routed


@pytest.mark.parametrize("options, plain", [({"gemm": "mkl"}, True), ({}, False)])
def test_mkl_option_or_probe_verdict_keeps_aten(monkeypatch, options, plain):
    """options gemm="mkl", or a probe that found oneDNN on the plain weight no faster than
    addmm: every GEMM stays on aten, forward and backward."""
    monkeypatch.setattr(gemmlib, "measured", lambda: gemmlib.Choice("onednn", plain, "test"))
    torch.manual_seed(0)
    assert_step_matches(MLP(), torch.randn(2, 9, 53), **options)
    assert count() == 0 and externs("mkldnn__linear_pointwise") == 0


def test_inference_graph_not_frozen_and_perf_log(caplog):
    """An inference graph that is not frozen routes its GEMMs too; EMBER_LOGS=perf says how
    many of the graph's GEMMs moved and their shapes."""
    from ember.backends.ember import perf_log
    torch.manual_seed(0)
    m, x = MLP().eval(), torch.randn(2, 9, 53)
    level, propagate = perf_log.level, perf_log.propagate
    perf_log.setLevel(logging.INFO)
    perf_log.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger=perf_log.name), torch.no_grad():
            torch.testing.assert_close(ember.compile(m, options={"freeze": False})(x), m(x),
                                       **TOL)
    finally:
        perf_log.setLevel(level)
        perf_log.propagate = propagate
    assert count() == 2
    text = {r.getMessage() for r in caplog.records if r.getMessage().startswith("gemm: ")}
    assert text == {"gemm: 2 of 2 mm/addmm on oneDNN (MxKxN: 18x53x37 x1, 18x37x29 x1); the "
                    "others on aten (under the size rule, a transposed first operand, or not "
                    "float32)"}


def seeded_mlp():
    """The same MLP each call (a module ember compiled once is not compiled again)."""
    torch.manual_seed(0)
    return MLP()


def test_graph_cache_holds_the_verdict_and_restores_the_count(monkeypatch):
    """A training step compiled under the verdict "oneDNN wins" is served from the graph cache
    (no new wrapper) with its onednn_gemms count restored; under the verdict "it does not" the
    cached graphs are not reused: compiled again, every GEMM on aten."""
    x = torch.randn(2, 9, 53)
    assert_step_matches(seeded_mlp(), x)
    assert count() == 4 and len(WRAPPERS) == 2                  # forward and backward
    ember.reset()
    assert_step_matches(seeded_mlp(), x)
    assert count() == 4 and len(WRAPPERS) == 2
    assert ember.stats()["counts"]["graph_cache_hits"] == 2
    ember.reset()
    monkeypatch.setattr(gemmlib, "measured", lambda: gemmlib.Choice("onednn", False, "test"))
    assert_step_matches(seeded_mlp(), x)
    assert count() == 0 and len(WRAPPERS) == 4
    assert ember.stats()["counts"].get("graph_cache_hits", 0) == 0
    assert sum(src.count("mkldnn__linear_pointwise") for src in WRAPPERS[2:]) == 0


def test_backend_cache_holds_the_gemm_choice(monkeypatch):
    """A warm start (backend cache) compiled under one probe verdict is not used under another:
    it would load graph-cache entries whose GEMMs the other verdict places elsewhere."""
    monkeypatch.setenv("EMBER_BACKEND_CACHE", "1")
    x = torch.randn(2, 9, 53)
    assert_step_matches(seeded_mlp(), x)
    ember.reset()
    assert_step_matches(seeded_mlp(), x)
    assert ember.stats()["counts"]["backend_cache_hits"] == 1 and count() == 4
    ember.reset()
    monkeypatch.setattr(gemmlib, "measured", lambda: gemmlib.Choice("onednn", False, "test"))
    assert_step_matches(seeded_mlp(), x)
    counts = ember.stats()["counts"]
    assert counts.get("backend_cache_hits", 0) == 0 and count() == 0
