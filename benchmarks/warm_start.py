"""Warm compile before/after (#23): for each model and each tree (BEFORE: env WARM_BEFORE, default
/work/main; AFTER: this checkout), ember cold (fresh EMBER_CACHE_DIR), then two warm starts
(same dir, new processes). Seconds = first call minus the median of 5 steady calls, inference
under no_grad, 1 thread. One JSON line per model and tree.

    python benchmarks/warm_start.py b_tv_resnet50 b_hf_bert ...   (names: ember bench --list)
"""
import json, os, subprocess, sys, tempfile
CHILD = r'''
import os, sys, time, json, statistics, torch
sys.path.insert(0, sys.argv[2])
from ember.bench import suites
import ember
torch.set_num_threads(1)
spec = suites.select("broad", "^" + sys.argv[1] + "$")[0]
model, args, kwargs = suites.instantiate(spec)
model.eval()
comp = ember.compile(model)
with torch.no_grad():
    t = time.perf_counter(); comp(*args, **kwargs); first = time.perf_counter() - t
    steady = []
    for _ in range(5):
        t = time.perf_counter(); comp(*args, **kwargs); steady.append(time.perf_counter() - t)
s = statistics.median(steady)
print(json.dumps({"first": first, "steady": s, "steady_min": min(steady), "steady_max": max(steady), "compile": first - s, "counts": ember.stats()["counts"]}))
'''
trees = {"before": os.environ.get("WARM_BEFORE", "/work/main"),
         "after": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
for m in sys.argv[1:]:
    for name, repo in trees.items():
        root = tempfile.mkdtemp(prefix="wb_")
        env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(root, "e"), MALLOC_MMAP_THRESHOLD_="4294967296",
                   MALLOC_TRIM_THRESHOLD_="68719476736", EMBER_SPEED_CHECK="0", PYTHONPATH=repo)
        row = {"model": m, "tree": name}
        for key in ("cold", "warm", "warm2"):
            p = subprocess.run([sys.executable, "-c", CHILD, m, repo], env=env, capture_output=True, text=True, cwd=repo)
            try:
                r = json.loads(p.stdout.strip().splitlines()[-1])
                row[key] = round(r["compile"], 2); row[key + "_steady"] = round(r["steady"], 4)
                row[key + "_steady_range"] = [round(r["steady_min"], 4), round(r["steady_max"], 4)]
                if key == "warm": row["warm_counts"] = {k: v for k, v in r["counts"].items() if "cache" in k}
            except Exception:
                row[key] = None; row[key + "_err"] = p.stderr[-400:]
        print(json.dumps(row), flush=True)
