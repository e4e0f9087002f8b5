"""ember bench's parts in isolation: path selection, fallback detection, hygiene env, report."""
import warnings

import pytest
import torch

from ember.bench import compilers, hygiene, report, suites
from ember.bench.harness import compare, flatten, reduce_loss, worst_excess


def test_fallback_warning_classification():
    assert compilers.is_fallback_warning("ember: capture is not implemented yet; M runs eagerly")
    assert compilers.is_fallback_warning(
        "ember: backend 'ember' failed in compile: X; running this graph eagerly")
    assert not compilers.is_fallback_warning("ember: graph break at m.py:3 (eager call to print)")
    assert not compilers.is_fallback_warning("something else runs eagerly")


def test_candidates_order():
    assert compilers.candidates("ember") == [
        ("ember.compile", "ember"), ("torch.compile", "ember"),
        ("ember.compile", "aot_eager"), ("torch.compile", "aot_eager")]
    assert compilers.candidates("ember", "aot_eager", "ember") == [("ember.compile", "aot_eager")]
    assert compilers.candidates("torch") == [("torch.compile", "inductor")]
    with pytest.raises(ValueError):
        compilers.candidates("tvm")


def test_first_working_skips_paths_that_raise_or_fall_back(monkeypatch):
    seen = []

    def fake_make(front, backend, model):
        path = compilers.Path(front, backend, counter=compilers.CompileCounter(lambda g, e: g, backend))
        seen.append((front, backend))
        if (front, backend) == ("ember.compile", "ember"):
            raise NotImplementedError("capture missing\nmore")
        if (front, backend) == ("torch.compile", "ember"):
            def run(x):
                warnings.warn("ember: backend 'ember' failed in compile: E; running this graph eagerly")
                return model(x)
            return run, path
        def run(x):
            path.counter.graphs += 1
            return model(x)
        return run, path

    monkeypatch.setattr(compilers, "make", fake_make)
    lin = torch.nn.Linear(2, 2)
    compiled, path, out, seconds = compilers.first_working(
        "ember", lambda: lin, lambda f: f(torch.ones(1, 2)))
    assert (path.front, path.backend) == ("ember.compile", "aot_eager")
    assert path.compiled and seconds >= 0
    assert path.rejected[0] == "ember.compile(backend='ember'): NotImplementedError: capture missing"
    assert "fell back to eager" in path.rejected[1]
    assert len(seen) == 3


def test_first_working_reports_the_best_path_when_nothing_compiles(monkeypatch):
    def fake_make(front, backend, model):
        return model, compilers.Path(front, backend, counter=compilers.CompileCounter(None, backend))
    monkeypatch.setattr(compilers, "make", fake_make)
    _, path, _, _ = compilers.first_working("ember", lambda: torch.nn.Identity(),
                                            lambda f: f(torch.ones(1)))
    assert not path.compiled and path.front == "ember.compile" and path.backend == "ember"
    assert path.problem == "compiled no graph" and len(path.rejected) == 4


def test_child_env_sets_hygiene_and_drops_strict():
    env, name = hygiene.child_env(3, "glibc-tuned", base={"EMBER_STRICT": "1", "PATH": "/bin"})
    assert name == "glibc-tuned"
    assert env["MALLOC_MMAP_THRESHOLD_"] == "4294967296"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "68719476736"
    assert env["OMP_NUM_THREADS"] == "3" and "EMBER_STRICT" not in env
    env, _ = hygiene.child_env(1, "system", strict=True, base={})
    assert env["EMBER_STRICT"] == "1" and "MALLOC_MMAP_THRESHOLD_" not in env


def test_suites_have_enough_models():
    counts = suites.count()
    assert sum(v for k, v in counts.items() if k not in suites.HIDDEN) >= 30
    assert counts["torchvision"] >= 10 and counts["timm"] >= 8 and counts["hf"] >= 7
    assert len(suites.select(quick=True)) == 3
    assert all(s.suite not in suites.HIDDEN for s in suites.select("all"))
    assert [s.name for s in suites.select("synthetic", "mlp")] == ["syn_mlp"]


def test_synthetic_models_run():
    for spec in suites.select("synthetic"):
        model, args, kwargs = suites.instantiate(spec)
        assert flatten(model(*args, **kwargs))


def test_compare_and_loss():
    a = [torch.tensor([1.0, 2.0]), torch.tensor([3])]
    b = [torch.tensor([1.0, 2.5], dtype=torch.float64), torch.tensor([3])]
    abs_err, rel_err, per = compare(a, b)
    assert abs_err == pytest.approx(0.5) and rel_err == pytest.approx(0.2) and per[1] == 0.0
    with pytest.raises(AssertionError):
        compare(a[:1], b)
    assert float(reduce_loss({"x": torch.zeros(2), "y": (torch.zeros(3),)})) == 0.0


def test_compare_nan_is_an_error_unless_the_reference_has_it():
    # a NaN difference compared as 0 error (max() and `>` skip NaN): a NaN output passed
    nan, inf = float("nan"), float("inf")
    ref = [torch.tensor([1.0, nan, inf, 4.0], dtype=torch.float64)]
    assert compare([torch.tensor([1.0, nan, inf, 4.0])], ref)[1] == 0.0
    assert compare([torch.tensor([1.0, nan, inf, nan])], ref)[1] == inf
    assert compare([torch.tensor([nan, nan, inf, 4.0])], ref)[1] == inf
    assert compare([torch.tensor([1.0, nan, -inf, 4.0])], ref)[1] == inf
    assert worst_excess(compare([torch.tensor([1.0, 2.0, inf, nan])], ref)[2], [0.0], 1e-5)


def _rec(model, comp, speedup, step, status="pass", mode="infer"):
    return {"model": model, "mode": mode, "compiler": comp, "status": status, "speedup": speedup,
            "step_s": step, "compile_s": 1.0, "first_call_s": 1.1, "rel_err": 1e-7,
            "mem_ratio": 1.0, "graphs": 1, "graph_breaks": 0, "path": "p", "error": None}


def test_report_summary_and_table(tmp_path):
    recs = [_rec("a", "eager", 1.0, 0.2), _rec("a", "ember", 2.0, 0.1), _rec("a", "torch", 1.0, 0.2),
            _rec("b", "eager", 1.0, 0.2), _rec("b", "ember", 0.5, 0.4),
            _rec("b", "torch", None, None, status="fail")]
    text = report.summary(recs)
    assert "ember  infer: pass 2/2 (100%), geomean speedup vs eager 1.00x" in text
    assert "torch  infer: pass 1/2 (50%) [fail 1]" in text
    assert "ember vs torch.compile infer: geomean 2.00x over 1 models" in text
    lines = report.table(recs).splitlines()
    assert lines[0].split()[:4] == ["model", "mode", "compiler", "status"]
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    assert "written" in report.plot(recs, str(out)) and out.stat().st_size > 1000


def test_tolerance_is_per_tensor():
    # tensor 1 is noise for eager too (a zero-in-exact-arithmetic gradient): not a failure
    assert worst_excess([1e-6, 0.3], [1e-7, 0.1], 1e-5) is None
    i, ratio = worst_excess([1e-3, 0.3], [1e-7, 0.1], 1e-5)
    assert i == 0 and ratio > 10


class _NanInDouble(torch.nn.Module):
    """ProphetNet-like: float32's min as a mask value overflows to NaN in an fp64 run only."""

    def forward(self, x):
        return x * 2 + (float("nan") if x.dtype == torch.float64 else 0.0)


def test_fp64_reference_with_nan_falls_back_to_eager_fp32():
    from ember.bench.harness import measure
    from ember.bench.spec import ModelSpec
    spec = ModelSpec("nan64", "test", _NanInDouble, lambda: (torch.randn(3, 4),))
    recs = []
    measure(spec, "infer", ["eager"], 1, 0, "ember", "ember", False, recs.append)
    (rec,) = recs
    assert rec["reference"].startswith("fp32 eager") and rec["rel_err"] == 0.0, rec


def test_compare_judges_a_gradient_zero_in_exact_arithmetic_against_the_largest_tensor():
    """BatchNorm -> 1x1 conv -> training-mode BatchNorm: the second BatchNorm removes any
    per-channel shift, so the first BatchNorm's bias gradient is zero in exact arithmetic (fp64:
    rounding residue) and any fp32 value there is noise. Noise at 1e-6 of the largest
    gradient (fp32 rounding of the terms that cancel) passes; 1e-3 of it still fails."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 8, 1),
                            torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    x = torch.randn(4, 3, 12, 12)

    def grads(model, inp):
        model.zero_grad()
        model(inp).square().mean().backward()
        return [p.grad.clone() for p in model.parameters()]
    import copy
    ref = grads(copy.deepcopy(m).double(), x.double())
    eager = grads(m, x)
    bias = 3                                         # parameters: conv w, b, bn w, bn b, ...
    overall = max(float(g.abs().max()) for g in ref)
    assert float(ref[bias].abs().max()) < 1e-12 * overall      # zero in exact arithmetic
    _, _, eager_per = compare(eager, ref)
    noisy = [g.clone() for g in eager]
    noisy[bias] += 1e-6 * overall * torch.randn(noisy[bias].shape)
    assert worst_excess(compare(noisy, ref)[2], eager_per, 1e-4) is None
    wrong = [g.clone() for g in eager]
    wrong[bias] += 1e-3 * overall
    assert worst_excess(compare(wrong, ref)[2], eager_per, 1e-4) is not None
