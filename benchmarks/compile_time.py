"""Cold and warm compile seconds of broad-suite models (#23), ember vs torch.compile, inference
under no_grad, 1 thread: first call minus the median of 5 steady calls. Each measurement runs in
its own process: ember cold (fresh EMBER_CACHE_DIR), `--warm` warm starts (the same cache dir, new
processes), Inductor cold (fresh TORCHINDUCTOR_CACHE_DIR; `--no-inductor` skips it). With several
`--tree`s (git checkouts, e.g. main and a branch) each model is measured on each tree in turn: a
before/after of a compile-time change. One JSON line per model and tree on stdout. `<run>_cpu` is
the same difference in this process's CPU time: on a loaded box it is the stable measure of a warm
start (no compiler subprocesses); it leaves out child processes (g++, Inductor's compile workers),
so cold compiles compare by wall time.

    python benchmarks/compile_time.py b_tv_resnet50 b_hf_bert ...   (names: ember bench --list)
    python benchmarks/compile_time.py --tree /work/main --tree . --warm 2 --no-inductor b_tv_swin_t
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import sys, time, json, statistics, torch
sys.path.insert(0, sys.argv[3])
from ember.bench import suites
import ember
torch.set_num_threads(1)
spec = suites.select("broad", "^" + sys.argv[1] + "$")[0]
model, args, kwargs = suites.instantiate(spec)
model.eval().requires_grad_(sys.argv[4] != "frozen")     # frozen: weights folded (freeze.py)
comp = ember.compile(model) if sys.argv[2] == "ember" else torch.compile(model)
with torch.no_grad():
    t, c = time.perf_counter(), time.process_time(); comp(*args, **kwargs)
    first, first_cpu = time.perf_counter() - t, time.process_time() - c
    steady, steady_cpu = [], []
    for _ in range(5):
        t, c = time.perf_counter(), time.process_time(); comp(*args, **kwargs)
        steady.append(time.perf_counter() - t); steady_cpu.append(time.process_time() - c)
s = statistics.median(steady)
counts = ember.stats()["counts"] if sys.argv[2] == "ember" else {}
print(json.dumps({"compile": first - s, "compile_cpu": first_cpu - statistics.median(steady_cpu),
                  "steady": s, "steady_range": [min(steady), max(steady)],
                  "cache_counts": {k: v for k, v in counts.items() if "cache" in k}}))
'''
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(model: str, compiler: str, tree: str, env: dict, frozen: bool, timeout: int) -> dict:
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, model, compiler, tree,
                            "frozen" if frozen else "-"], env=env, cwd=tree,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"compile": None, "err": f"timeout after {timeout} s"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"compile": None, "err": p.stderr[-400:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tree", action="append", default=None,
                    help="checkout to measure (repeatable; default: this one)")
    ap.add_argument("--warm", type=int, default=1, help="warm starts per model and tree")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per measurement")
    ap.add_argument("--frozen", action="store_true",
                    help="parameters not requiring grad: ember freezes the weights")
    a = ap.parse_args()
    trees = [os.path.abspath(t) for t in a.tree or [HERE]]
    for m in a.models:
        for tree in trees:
            root = tempfile.mkdtemp(prefix="ctime_")
            env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(root, "e"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "i"), PYTHONPATH=tree,
                       MALLOC_MMAP_THRESHOLD_="4294967296", MALLOC_TRIM_THRESHOLD_="68719476736",
                       EMBER_SPEED_CHECK="0")
            runs = [("ember_cold", "ember")] + [(f"ember_warm{i + 1}", "ember")
                                                for i in range(a.warm)]
            if not a.no_inductor:
                runs.append(("inductor_cold", "torch"))
            row = {"model": m, "tree": tree}
            for key, comp in runs:
                r = measure(m, comp, tree, env, a.frozen, a.timeout)
                row[key] = None if r["compile"] is None else round(r["compile"], 2)
                if r.get("compile_cpu") is not None:
                    row[key + "_cpu"] = round(r["compile_cpu"], 2)
                row[key + "_steady"] = round(r["steady"], 4) if "steady" in r else None
                if r.get("cache_counts"):
                    row[key + "_cache"] = r["cache_counts"]
                if "err" in r:
                    row[key + "_err"] = r["err"]
            if row.get("ember_cold") and row.get("inductor_cold"):
                row["cold_ratio"] = round(row["ember_cold"] / row["inductor_cold"], 3)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
