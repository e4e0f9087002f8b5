"""Cold and warm compile seconds of broad-suite models (#23), ember vs torch.compile, inference:
first call minus a steady call, 1 thread. Each measurement runs in its own process: ember cold
(fresh EMBER_CACHE_DIR), ember warm (the same cache dir, a new process), Inductor cold (fresh
TORCHINDUCTOR_CACHE_DIR). One JSON line per model on stdout.

    python benchmarks/compile_time.py b_tv_resnet50 b_hf_bert ...   (names: ember bench --list)
"""
import json, os, subprocess, sys, tempfile, time
CHILD = r'''
import os, sys, time, json, torch
sys.path.insert(0, sys.argv[3])
from ember.bench import suites
import ember
torch.set_num_threads(1)
spec = suites.select("broad", "^" + sys.argv[1] + "$")[0]
model, args, kwargs = suites.instantiate(spec)
model.eval()
comp = ember.compile(model) if sys.argv[2] == "ember" else torch.compile(model)
with torch.no_grad():
    t = time.perf_counter(); comp(*args, **kwargs); first = time.perf_counter() - t
    t = time.perf_counter(); comp(*args, **kwargs); steady = time.perf_counter() - t
print(json.dumps({"first": first, "steady": steady, "compile": first - steady}))
'''
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for m in sys.argv[1:]:
    root = tempfile.mkdtemp(prefix="ctime_")
    env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(root, "e"), TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "i"),
               MALLOC_MMAP_THRESHOLD_="4294967296", MALLOC_TRIM_THRESHOLD_="68719476736", EMBER_SPEED_CHECK="0")
    row = {"model": m}
    for key, comp in (("ember_cold", "ember"), ("ember_warm", "ember"), ("inductor_cold", "torch")):
        p = subprocess.run([sys.executable, "-c", CHILD, m, comp, REPO], env=env, capture_output=True, text=True, timeout=1200)
        try:
            row[key] = round(json.loads(p.stdout.strip().splitlines()[-1])["compile"], 2)
        except Exception:
            row[key] = None; row[key + "_err"] = p.stderr[-300:]
    row["cold_ratio"] = row["ember_cold"] / row["inductor_cold"] if row.get("ember_cold") and row.get("inductor_cold") else None
    print(json.dumps(row), flush=True)
