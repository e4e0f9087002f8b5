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


KINK_SNIPPET = r'''
import math, sys, torch
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import op_sweep as S
torch.manual_seed(0)
# relu(x * w) with 10 pre-activations within fp32 rounding of the kink (x ~ 1e-9 against w's 1e-3
# steps), the rest far from it
x = torch.randn(64, 32)
x[0, :10] = torch.tensor([1e-9, -1e-9] * 5)
case = S.Case(lambda m, x: torch.relu(x * m.w + m.b), [x],
              params={"w": torch.linspace(0.5, 1.5, 32), "b": torch.full((32,), 1e-9)})
m = S.Pattern(case)
xs = [x.clone().requires_grad_()]
g = [torch.randn(64, 32)]
eager = S.Step(m, xs, "train", g)
ref = eager.observed(eager())
allow, info = S.kink_allowance(m, xs, g)
assert info["kinked_calls"] == 1, info
# a flipped mask bit where the pre-activation is within rounding of 0: allowed
flipped = [t.clone() for t in ref]
flipped[1][0, 0] = 0.0 if ref[1][0, 0] != 0 else g[0][0, 0] * 0.5     # (observed: out, x.grad, ...)
errs = S.rel_errs(flipped, ref)
assert errs[1] > S.TOL["train"] and errs[1] <= allow[1] + S.TOL["train"], (errs, allow)
# the same error where the pre-activation is far from 0 stays wrong: the allowance is measured,
# not a blanket (only the near-kink elements move in fp64)
far = [t.clone() for t in ref]
far[1][5, 5] += 0.9 * float(ref[1].abs().max())
assert S.rel_errs(far, ref)[1] > allow[1] + S.TOL["train"], (S.rel_errs(far, ref), allow)
# no kinked activation: no allowance
case2 = S.Case(lambda m, x: torch.tanh(x * m.w), [x], params={"w": torch.ones(32)})
assert S.kink_allowance(S.Pattern(case2), xs, g) is None
print("ok")
'''


def test_kink_allowance_forgives_only_flips_near_the_kink():
    """basicblock_tail/train failed the sweep's check (0.07 > 1e-3): one ReLU input within
    rounding of 0 flipped. The allowance (as `ember bench` measures it) covers such flips and
    not an error elsewhere."""
    from ember.bench.hygiene import MALLOC_ENV
    env = {**os.environ, **MALLOC_ENV}
    code = f"ROOT = {ROOT!r}\n" + KINK_SNIPPET
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
