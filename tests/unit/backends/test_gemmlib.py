"""Frozen linears on oneDNN's GEMM and the probe that picks the library (ember/backends/
gemmlib.py, prepack.py; docs/design/071).

Values vs eager at atol=rtol=1e-4 (float32): oneDNN's GEMM sums in another order than addmm's,
so results differ in rounding only."""
import copy
import json
import logging
import os
import threading

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends import freeze as fz
from ember.backends import gemmlib, prepack
from ember.backends.ember import STATS

from tests.unit.backends.test_prepack import Conv1D

TOL = dict(atol=1e-4, rtol=1e-4)
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
ONEDNN = gemmlib.Choice("onednn", True, "test")


@pytest.fixture(autouse=True)
def small_weights(monkeypatch):
    monkeypatch.setattr(prepack, "MIN_WEIGHT", 1 << 15)       # keep the test's weights small
    monkeypatch.setattr(prepack, "PLAIN_MIN_WEIGHT", 1 << 15)
    monkeypatch.setattr(gemmlib, "measured", lambda: ONEDNN)


def count(name):
    return ember.stats()["counts"].get(name, 0)


def externs(op):
    return sum(f"{op}.default" in s.get("fallbacks", ()) for s in STATS)


class Net(nn.Module):
    """Odd sizes; with and without bias; a Conv1D; the first linear reads a transposed
    (non-contiguous) input."""

    def __init__(self, bias=True):
        super().__init__()
        self.fc1, self.c1 = nn.Linear(131, 517, bias=bias), Conv1D(517, 259)
        self.fc2 = nn.Linear(259, 301, bias=bias)

    def forward(self, x):                 # x: [..., 131, rows] read as [..., rows, 131]
        return self.fc2(torch.relu(self.c1(torch.nn.functional.gelu(self.fc1(
            x.transpose(-1, -2))))))


def compile_frozen(m, **options):
    ref = copy.deepcopy(m)
    return ember.compile(m.requires_grad_(False), options={"freeze": True, **options}), ref


def check(m, ref, x):
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x), **TOL)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(131, 37), (3, 131, 5), (2, 131, 2)])
def test_onednn_packed_linears_match_eager(shape, bias):
    """2-D and 3-D inputs, non-contiguous, 2 to 37 rows, bias or none: all three linears on
    oneDNN's packed GEMM, values as eager's."""
    torch.manual_seed(0)
    m, ref = compile_frozen(Net(bias).eval())
    x = torch.randn(*shape)
    check(m, ref, x)
    check(m, ref, x)
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 3
    assert externs("mkldnn._linear_pointwise") == 1 and externs("mkl._mkl_linear") == 0


def test_one_row_keeps_mkls_rule():
    """At one row (a GEMV) the MKL rule holds: only the wide-output linear (517 >= 2 x 131) is
    packed, by MKL, even where oneDNN is the library."""
    if not torch.backends.mkl.is_available():
        pytest.skip("no MKL")
    torch.manual_seed(0)
    m, ref = compile_frozen(Net().eval())
    check(m, ref, torch.randn(131, 1))
    assert count("prepacked_linears") == 1 and externs("mkl._mkl_linear") == 1
    assert externs("mkldnn._linear_pointwise") == 0


def test_onednn_pack_follows_weight_changes():
    torch.manual_seed(0)
    m, ref = compile_frozen(Net().eval())
    x = torch.randn(2, 131, 8)
    check(m, ref, x)
    with torch.no_grad():
        for mod in (m, ref):
            mod.fc1.weight.mul_(-0.5)
            mod.c1.weight.add_(0.25)
    check(m, ref, x)
    assert count("refolds") == 1 and count("prepacked_linears") == 3


@pytest.mark.parametrize("plain", [True, False])
def test_over_budget_linears_run_onednn_on_the_plain_weight(monkeypatch, plain):
    """No budget for packs: the linears of >= PLAIN_ROWS rows run oneDNN on their own weight
    (no copy) where the probe found that faster than addmm, else stay aten linears."""
    monkeypatch.setattr(gemmlib, "measured", lambda: gemmlib.Choice("onednn", plain, "test"))
    monkeypatch.setattr(fz, "MIN_BUDGET", 0)
    monkeypatch.setattr(fz, "BUDGET_FRACTION", 0.0)
    torch.manual_seed(0)
    m, ref = compile_frozen(Net().eval())
    x = torch.randn(131, prepack.PLAIN_ROWS)
    check(m, ref, x)
    check(m, ref, x)
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 0
    assert count("onednn_plain_linears") == (3 if plain else 0)
    assert externs("mkldnn._linear_pointwise") == plain
    m, ref = compile_frozen(Net().eval())                      # too few rows: aten
    check(m, ref, torch.randn(131, prepack.PLAIN_ROWS - 1))
    assert count("onednn_plain_linears") == (3 if plain else 0)


def test_budget_counts_a_onednn_pack_as_its_weight(monkeypatch):
    """oneDNN's pack is the weight's size: a budget of exactly the first two weights packs
    those two; the third runs oneDNN on its plain weight."""
    torch.manual_seed(0)
    net = Net().eval()
    need = sum(prepack.packed_bytes(*mod.weight.shape, 37, "onednn") for mod in (net.fc1,))
    need += prepack.packed_bytes(*net.c1.weight.shape[::-1], 37, "onednn")
    assert need == 4 * (517 * 131 + 259 * 517)
    bias_bytes = 4 * (517 + 259 + 301)
    monkeypatch.setattr(fz, "MIN_BUDGET", 0)
    monkeypatch.setattr(fz, "BUDGET_FRACTION", (need + 0.5) / (need + bias_bytes + 4 * 301 * 259))
    m, ref = compile_frozen(net)
    check(m, ref, torch.randn(131, 37))
    assert count("frozen_graphs") == 1 and count("prepacked_linears") == 2
    assert count("onednn_plain_linears") == 1


@pytest.mark.filterwarnings("ignore:TF32 acceleration")    # flags() sets oneDNN's TF32 too
def test_gemm_option_forces_a_library_and_is_checked():
    if not torch.backends.mkl.is_available():
        pytest.skip("no MKL")
    torch.manual_seed(0)
    m, ref = compile_frozen(Net().eval(), gemm="mkl")
    check(m, ref, torch.randn(131, 37))
    assert count("prepacked_linears") == 3 and externs("mkl._mkl_linear") == 1
    assert externs("mkldnn._linear_pointwise") == 0
    with pytest.raises(ValueError, match="options gemm"):
        gemmlib.choice({"gemm": "blas"})
    with torch.backends.mkldnn.flags(enabled=False):       # oneDNN turned off: MKL
        assert gemmlib.choice({}).library == "mkl" == gemmlib.choice({"gemm": "onednn"}).library


def fake_times(**per_round):
    """_time_variants' answer: seconds per round for each GEMM (a number: the same each round)."""
    return lambda m, k, n, mkl: {name: list(v) if isinstance(v, (list, tuple)) else
                                 [v] * gemmlib.ROUNDS for name, v in per_round.items()}


@pytest.mark.parametrize("mkl_s, dnn_s, want", [(1.0, 0.80, "onednn"), (1.0, 0.97, "mkl"),
                                                 (0.8, 1.0, "mkl")])
def test_probe_picks_the_faster_library_by_a_margin(monkeypatch, mkl_s, dnn_s, want):
    """oneDNN only when its packed GEMM beats MKL's by MARGIN over the probe shapes; the plain
    weight only when oneDNN on it beats addmm by MARGIN."""
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(gemmlib, "_time_variants", fake_times(
        addmm=1.0, mkl=mkl_s, onednn=dnn_s, plain=dnn_s))
    got = gemmlib.probe()
    assert got.library == want and got.plain == (dnn_s * gemmlib.MARGIN < 1.0) and got.sure
    assert "mkl/onednn" in got.why


def test_probe_decides_on_the_median_round_not_the_fastest(monkeypatch):
    """Per-round ratios' median: plain oneDNN takes 0.85 of addmm's time in most rounds; one
    lucky addmm round (what the minimum time picked: addmm/plain 0.7) changes nothing, nor does
    one slow plain round (preempted)."""
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    r = gemmlib.ROUNDS
    addmm, plain = [1.0] * r, [0.85] * r
    addmm[3], plain[5] = 0.5, 3.0
    monkeypatch.setattr(gemmlib, "_time_variants", fake_times(
        addmm=addmm, mkl=1.0, onednn=0.8, plain=plain))
    before = count("gemm_probes")
    got = gemmlib.probe()
    assert (got.library, got.plain, got.sure) == ("onednn", True, True)
    assert count("gemm_probes") == before + 1 and "addmm/plain 1.18, 1.18" in got.why


def wide_then_narrow(monkeypatch, n_wide):
    """Fake timings: the first n_wide tries' addmm/plain ratios alternate 1.29 / 0.9 (spread
    1.43), later ones are all 1.1; oneDNN packed beats MKL by 1.25."""
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    calls = []

    def times(m, k, n, mkl):
        calls.append((m, k, n))
        wide = (len(calls) - 1) // len(gemmlib.PROBE_SHAPES) < n_wide
        r = gemmlib.ROUNDS
        addmm = [1.1 / 0.85 if i % 2 else 0.9 for i in range(r)] if wide else [1.1] * r
        return {"addmm": addmm, "mkl": [1.0] * r, "onednn": [0.8] * r, "plain": [1.0] * r}
    monkeypatch.setattr(gemmlib, "_time_variants", times)


def test_probe_tries_again_while_the_spread_is_too_wide(monkeypatch, tmp_path):
    """A try whose per-round ratios spread over SPREAD decides nothing; the next one does, and
    is cached on disk."""
    monkeypatch.undo()
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemmlib, "_CHOICES", {})
    wide_then_narrow(monkeypatch, gemmlib.TRIES - 1)
    tries, unsure = count("gemm_probes"), count("gemm_probe_unsure")
    got = gemmlib.choice({})
    assert (got.library, got.plain, got.sure) == ("onednn", True, True)
    assert count("gemm_probes") == tries + gemmlib.TRIES and count("gemm_probe_unsure") == unsure
    assert f"(try {gemmlib.TRIES})" in got.why and "addmm/plain 1.10, 1.10 (spread 1.00)" in got.why
    assert len(list((tmp_path / "probe").glob("gemm-*.json"))) == 1


def test_probe_too_wide_in_every_try_keeps_mkl_cached_for_a_while(monkeypatch, tmp_path):
    """No try within SPREAD: MKL and no plain oneDNN (as options gemm='mkl'), counted, memoized
    and cached on disk marked unsure: a new process within UNSURE_TTL reads it (the same backend
    cache keys, no probe), after it probes again."""
    monkeypatch.undo()
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemmlib, "_CHOICES", {})
    wide_then_narrow(monkeypatch, gemmlib.TRIES)
    tries, unsure = count("gemm_probes"), count("gemm_probe_unsure")
    got = gemmlib.choice({})
    assert (got.library, got.plain, got.sure) == ("mkl", False, False)
    assert count("gemm_probes") == tries + gemmlib.TRIES
    assert count("gemm_probe_unsure") == unsure + 1 and got.why.startswith("probe unsure")
    assert gemmlib.choice({}) is got
    [path] = (tmp_path / "probe").glob("gemm-*.json")
    gemmlib._CHOICES.clear()                  # a new process: the unsure answer, read
    again = gemmlib.choice({})
    assert (again.library, again.plain, again.sure) == ("mkl", False, False)
    assert again.why.endswith("(cached)") and count("gemm_probes") == tries + gemmlib.TRIES
    old = path.stat().st_mtime - gemmlib.paired.UNSURE_TTL - 1
    os.utime(path, (old, old))
    gemmlib._CHOICES.clear()                  # expired: probes again (narrow this time)
    fresh = gemmlib.choice({})
    assert fresh.plain and fresh.sure and count("gemm_probes") == tries + gemmlib.TRIES + 1
    assert json.loads(path.read_text())["sure"] is True


@pytest.fixture
def one_thread():
    """The probe's clock is thread CPU time with one thread (wall time otherwise)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_probe_runs_once_per_machine_cached_on_disk_and_logged(monkeypatch, tmp_path, caplog,
                                                              one_thread):
    """The real probe (a few GEMMs, thread CPU time) runs once; a new process (the memo
    cleared) reads its answer from the cache dir; EMBER_LOGS=perf records it. A probe that
    stayed unsure (a very loaded machine) is cached too, marked unsure."""
    monkeypatch.undo()                                # the real `measured`
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemmlib, "_CHOICES", {})
    calls = []
    real = gemmlib.probe
    monkeypatch.setattr(gemmlib, "probe", lambda: calls.append(1) or real())
    lg = gemmlib.perf_log
    level, propagate = lg.level, lg.propagate
    lg.setLevel(logging.INFO)
    lg.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger=lg.name):
            first = gemmlib.choice({})
            assert gemmlib.choice({}) is first
            gemmlib._CHOICES.clear()
            again = gemmlib.choice({})
    finally:
        lg.setLevel(level)
        lg.propagate = propagate
    text = sorted({r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("gemm library")}, key=len)
    assert first.library in ("mkl", "onednn") and len(text) == 2
    assert calls == [1] and (again.library, again.plain, again.sure) == \
        (first.library, first.plain, first.sure)
    assert first.sure or (first.library, first.plain) == ("mkl", False)
    assert all("gemm library for frozen linears: " + first.library in t for t in text)
    assert "probe (try " in text[0] and "(cached)" in text[1]


@pytest.mark.slow
def test_probe_verdict_holds_under_a_competing_load(one_thread):
    """The real probe's verdict with a thread looping one-thread GEMMs beside it (competing for
    the cores, the L3 and memory bandwidth) is the quiet verdict: the minimum-time probe
    flipped its plain verdict in 2 of 10 quiet runs and 8 of 10 loaded ones (docs/design/083)."""
    quiet = gemmlib.probe()
    if not quiet.sure:
        pytest.skip("no quiet reference: the probe stayed unsure: " + quiet.why)
    stop = threading.Event()

    def burn():
        a = torch.randn(1024, 1024)
        while not stop.is_set():
            a @ a
    t = threading.Thread(target=burn)
    t.start()
    try:
        loaded = [gemmlib.probe() for _ in range(3)]
    finally:
        stop.set()
        t.join()
    for got in loaded:
        assert (got.library, got.plain) == (quiet.library, quiet.plain) if got.sure else \
            (got.library, got.plain) == ("mkl", False), (quiet.why, got.why)


def test_probe_times_float32_under_autocast(monkeypatch):
    """A compile under CPU autocast must not time bfloat16 GEMMs for the float32 linears."""
    seen = []
    real = torch.addmm
    monkeypatch.setattr(gemmlib, "ROUNDS", 1)
    monkeypatch.setattr(torch, "addmm", lambda *a: seen.append(real(*a).dtype) or real(*a))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gemmlib._time_variants(16, 64, 96, torch.backends.mkl.is_available())
    assert seen and set(seen) == {torch.float32}


@pytest.mark.parametrize("text", ["[1, 2]", '{"library": "mkl"}', "not json"])
def test_a_cached_answer_that_is_not_one_probes_again(monkeypatch, tmp_path, text):
    """A probe file holding valid JSON that is not an answer (a list, missing keys) or no JSON
    is read as none: the probe runs and rewrites it."""
    monkeypatch.undo()
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemmlib, "_CHOICES", {})
    wide_then_narrow(monkeypatch, 0)
    path = tmp_path / "probe" / f"gemm-{gemmlib.machine_key()}.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    tries = count("gemm_probes")
    got = gemmlib.choice({})
    assert (got.library, got.plain, got.sure) == ("onednn", True, True)
    assert count("gemm_probes") == tries + 1 and json.loads(path.read_text())["sure"] is True
