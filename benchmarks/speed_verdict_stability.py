"""How often the speed check's verdict (backends/speed.py: a graph's kernels or eager PyTorch)
flips between processes, quiet and under a competing load. docs/design/090.

Each run is a fresh process with a fresh cache dir (a copy of one seeded by a first, discarded
run, so its kernels and the GEMM probe's answer are already there and only the speed verdict is
new) that compiles KINDS, calls each one CALLS times (past every re-timing) with one thread, and
prints its final decisions. RUNS runs quiet, RUNS with LOAD processes each looping a one-thread
1024^3 matmul (competing for the cores, the L3 and memory bandwidth). Prints each run's
verdicts, kernels/eager ratios and the timing's cost (seconds the timed calls took beyond a plain
call, thread CPU and wall), then the verdict counts per kind and condition.

    PYTHONPATH=<tree> python benchmarks/speed_verdict_stability.py --runs 10 --load 2

Run against either tree (it reads `speed.DECISIONS`)."""
import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CALLS = 40


def _kinds():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    ln = nn.LayerNorm(768)
    gn = nn.GroupNorm(32, 256)
    conv = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()).eval()
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    return {
        "layernorm": (lambda x: ln(x), lambda: torch.randn(8, 512, 768), False),
        "groupnorm_silu": (lambda x: F.silu(gn(x)), lambda: torch.randn(4, 256, 32, 32), False),
        "softmax": (lambda x: torch.softmax(x, -1), lambda: torch.randn(32, 128, 512), False),
        "conv_bn_relu": (conv, lambda: torch.randn(8, 64, 28, 28), False),
        "mlp_train": (lambda x: mlp(x).square().mean(), lambda: torch.randn(64, 256), True),
    }


def child():
    import torch
    torch.set_num_threads(1)
    import ember
    from ember.backends import speed
    out = {}
    for name, (fn, make, train) in _kinds().items():
        speed.DECISIONS.clear()
        f = ember.compile(fn)
        x = make()
        walls, cpus = [], []
        for _ in range(CALLS):
            t0, c0 = time.perf_counter(), time.thread_time()
            if train:
                f(x).backward()
            else:
                with torch.no_grad():
                    f(x)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
        # the timing's cost: what calls 2.. took beyond as many plain calls
        cost = {k: sum(v[1:]) - (len(v) - 1) * statistics.median(v[1:])
                for k, v in (("cpu", cpus), ("wall", walls))}
        out[name] = {"decisions": [{k: d.get(k) for k in ("graph", "choice", "kernels_ms",
                                                          "eager_ms", "source", "ratio",
                                                          "spread", "rounds", "sure")}
                                   for d in speed.DECISIONS],
                     "cost_cpu_s": cost["cpu"], "cost_wall_s": cost["wall"]}
    print("RESULT " + json.dumps(out), flush=True)


def _run_child(cache):
    env = {**os.environ, "EMBER_CACHE_DIR": cache, "EMBER_SPEED_CHECK": "1",
           "MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
    p = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True,
                       text=True)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-4000:])
    return json.loads(line[7:])


def _final(d):
    """The settled decision of a kind: its last one (a provisional one is re-timed later)."""
    return d["decisions"][-1] if d["decisions"] else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=2, help="competing processes")
    ap.add_argument("--conditions", default="quiet,load")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child()
    import _timing
    seed = tempfile.mkdtemp(prefix="speedverdict-seed-")
    _run_child(seed)                                    # builds the kernels; verdicts dropped
    shutil.rmtree(os.path.join(seed, "speed"), ignore_errors=True)
    counts = {}
    for cond in args.conditions.split(","):
        with _timing.competing_load(args.load if cond == "load" else 0):
            for i in range(args.runs):
                cache = tempfile.mkdtemp(prefix="speedverdict-")
                shutil.copytree(seed, cache, dirs_exist_ok=True)
                res = _run_child(cache)
                shutil.rmtree(cache, ignore_errors=True)
                parts = []
                for name, d in res.items():
                    f = _final(d)
                    choice = f["choice"] if f else "none"
                    if f and f.get("sure") is False:
                        choice += " (unsure)"
                    counts.setdefault((cond, name), collections.Counter())[choice] += 1
                    ratios = ", ".join(
                        f"{x['kernels_ms'] / x['eager_ms']:.2f}" if x.get("ratio") is None else
                        f"{x['ratio']:.2f}/{x['spread']:.2f}/{x['rounds']}"
                        for x in d["decisions"])
                    parts.append(f"{name} {choice} [{ratios}] cost {d['cost_cpu_s']:.2f}/"
                                 f"{d['cost_wall_s']:.2f}s")
                print(f"{cond} {i}: load1 {os.getloadavg()[0]:.1f} | " + " | ".join(parts),
                      flush=True)
    for (cond, name), c in counts.items():
        print(f"{cond} {name}: " + ", ".join(f"{k} {n}" for k, n in sorted(c.items())))
    shutil.rmtree(seed, ignore_errors=True)


if __name__ == "__main__":
    main()
