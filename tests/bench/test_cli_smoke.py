"""`ember bench` end to end through the CLI, on the test-only suite (tiny models, seconds).

The suite's failing models come first: one raises in forward, one kills its own process. Both
must be reported (fail / crash with the exception class and first line) and the suite must go on
to the tiny MLP after them.
"""
import json
import os
import subprocess
import sys
import time

import pytest

FIELDS = {"model", "suite", "mode", "compiler", "status", "error", "path", "graphs", "graph_breaks",
          "max_err", "rel_err", "first_call_s", "compile_s", "step_s", "speedup", "mem_ratio",
          "peak_bytes", "threads", "allocator", "env", "reps", "times", "wall_times", "clock"}


def _run(tmp_path, *args, timeout=110):
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "ember.bench", *args, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return proc.stdout, records


def test_smoke_reports_failures_and_goes_on(tmp_path):
    stdout, records = _run(tmp_path, "--suite", "test", "--quick", "--compilers", "eager,ember",
                           "--reps", "2", "--warmup", "1")
    by = {(r["model"], r["compiler"]): r for r in records}
    assert set(by) == {(m, c) for m in ("test_raises", "test_crashes", "test_tiny_mlp")
                       for c in ("eager", "ember")}

    raised = by[("test_raises", "eager")]
    assert raised["status"] == "fail"
    assert raised["error"].startswith("RuntimeError: deliberate failure")
    assert "second line" not in raised["error"]
    assert by[("test_raises", "ember")]["status"] == "fail"
    assert by[("test_crashes", "eager")]["status"] == "crash"
    assert "exit code 3" in by[("test_crashes", "ember")]["error"]

    ok = by[("test_tiny_mlp", "eager")]
    assert FIELDS <= set(ok), FIELDS - set(ok)
    assert ok["status"] == "pass" and ok["speedup"] == 1.0 and len(ok["times"]) == 2, ok
    assert ok["threads"] >= 1 and ok["allocator"]
    # one intra-op thread: rounds in the worker thread's CPU time, never more than wall time
    assert ok["clock"] == ("thread_cpu" if ok["threads"] == 1 else "wall"), ok["clock"]
    assert all(t <= w + 1e-4 for t, w in zip(ok["times"], ok["wall_times"]))
    assert ok["env"]["strict"] == ""          # EMBER_STRICT from conftest does not leak
    em = by[("test_tiny_mlp", "ember")]
    assert FIELDS <= set(em), FIELDS - set(em)
    # whatever path won, it is named, and the status says whether it really compiled
    assert em["path"] and em["status"] in ("pass", "fallback", "wrong")
    assert em["status"] != "pass" or (em["compiled"] and em["graphs"] >= 1)
    assert em["rel_err"] is not None and em["speedup"] > 0

    assert "summary" in stdout and "pass 1/3" in stdout
    assert "test_tiny_mlp" in stdout.split("summary")[0]


def test_list_and_counts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ember.bench", "--list"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip().splitlines()[-1].split()[0]) >= 30


@pytest.mark.slow
def test_quick_real_models(tmp_path):
    """The CI --quick run: 3 small real models, eager vs ember, plus the failing test model."""
    stdout, records = _run(tmp_path, "--quick", "--compilers", "eager,ember", "--reps", "2",
                           "--include-test-models", "--models", "resnet18|mlp|nanogpt|raises",
                           timeout=300)
    models = {r["model"] for r in records}
    assert {"tv_resnet18", "syn_mlp", "syn_nanogpt", "test_raises"} <= models
    assert all(r["status"] == "pass" for r in records if r["compiler"] == "eager"
               and r["model"] != "test_raises")


def test_hanging_model_times_out(tmp_path):
    t0 = time.monotonic()
    _, records = _run(tmp_path, "--suite", "test_hang", "--compilers", "eager,ember", "--reps", "1",
                      "--timeout", "12")
    assert time.monotonic() - t0 < 90
    assert {r["compiler"]: r["status"] for r in records} == {"eager": "timeout", "ember": "timeout"}
    assert "timeout after 12 s" in records[0]["error"]
