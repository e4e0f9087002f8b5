"""benchmarks/op_sweep.py end to end at toy sizes without torch.compile, so the script cannot rot:
two patterns, both modes, values checked against eager, JSON lines written."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_op_sweep_toy(tmp_path):
    from ember.bench.hygiene import MALLOC_ENV
    out = tmp_path / "sweep.jsonl"
    env = {**os.environ, **MALLOC_ENV, "EMBER_CACHE_DIR": str(tmp_path / "cache")}  # no re-exec
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "op_sweep.py"), "--no-torch",
           "--only", "^(layernorm_last_768|channel_shuffle)$", "--scale", "0.05", "--rounds", "2",
           "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["pattern"], r["mode"]) for r in rows} == {
        (p, m) for p in ("layernorm_last_768", "channel_shuffle") for m in ("infer", "train")}
    for r in rows:
        assert r["status"] == "pass", r
        assert r["ember_counts"]["graphs"] >= 1 and r["ember_counts"]["fallbacks"] == 0
        assert r["eager_ms"] > 0 and r["ember_ms"] > 0 and "inductor_ms" not in r
        assert 0 < r["ember_vs_eager"]["p25"] <= r["ember_vs_eager"]["median"] <= r["ember_vs_eager"]["p75"]
    assert "below 0.95x eager" in proc.stdout
