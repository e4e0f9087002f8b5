"""Inference A/B on one broad-suite model: eager vs ember (layout auto) vs ember with the captured
layout (options layout=contiguous), paired alternating rounds, thread CPU (1 thread).
python benchmarks/bnclast_infer_ab.py MODEL ROUNDS"""
import copy, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import prepare, paired, ratio_stats
prepare()
os.environ["EMBER_BACKEND_CACHE"] = "0"; os.environ.setdefault("EMBER_SPEED_CHECK", "0")
import statistics as st, torch, ember
torch.set_num_threads(1)
from ember.bench import suites  # noqa
from ember.bench.spec import REGISTRY
spec = REGISTRY[sys.argv[1]]; torch.manual_seed(0)
m = spec.build().eval(); args = spec.inputs()
def mk(f):
    def g():
        with torch.no_grad(): f(*args)
    return g
fns = {"eager": mk(copy.deepcopy(m)), "new": mk(ember.compile(copy.deepcopy(m))),
       "old": mk(ember.compile(copy.deepcopy(m), options={"layout": "contiguous"}))}
for f in fns.values(): f(); f()
load0 = os.getloadavg()[0]
ts, _ = paired(fns, rounds=int(sys.argv[2]), reps=1)
print(sys.argv[1], "infer ms", {k: round(st.median(v) * 1e3, 2) for k, v in ts.items()})
for a, b in (("eager", "new"), ("eager", "old"), ("old", "new")):
    r = ratio_stats(ts[a], ts[b]); print("  %s/%s %.3f [%.3f..%.3f]" % (a, b, r["median"], r["min"], r["max"]))
print("  load %.1f -> %.1f, thread CPU, EMBER_SPEED_CHECK=%s" % (load0, os.getloadavg()[0], os.environ["EMBER_SPEED_CHECK"]))
