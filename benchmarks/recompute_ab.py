"""Design 039 A/B: python benchmarks/recompute_ab.py MODEL [reps] (see the docstring below)."""
"""Paired A/B in one process: eager vs ember (new rule) vs ember (old rule: stores every
multi-use value with 2 full loads). python ab.py MODEL [reps]"""
import copy, os, sys, time, statistics as st
os.environ["EMBER_BACKEND_CACHE"] = "0"; os.environ.setdefault("EMBER_SPEED_CHECK", "0")
import torch
os.environ["EMBER_CACHE_DIR"] = "/tmp/bnrecomp/cache_new_%d" % os.getpid()
torch.set_num_threads(1)
import ember, ember.aot
import ember.lower.lowering as L
from ember.bench import suites  # noqa
from ember.bench.spec import REGISTRY
name = sys.argv[1]; reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
spec = REGISTRY[name]
torch.manual_seed(0)
m = spec.build().train()
args = spec.inputs(); kw = spec.kwargs()
e = copy.deepcopy(m)
new = ember.compile(copy.deepcopy(m))
def out0(o):
    if isinstance(o, torch.Tensor): return o
    if isinstance(o, (tuple, list)): return out0(o[0])
    if isinstance(o, dict): return out0(next(iter(o.values())))
    return out0(o.logits if hasattr(o, "logits") else o[0])
def step(f):
    out0(f(*args, **kw)).float().mean().backward()
step(new); step(new)
import sys as _s
P = _s.modules["ember.aot.partition"]
real, realp, realw = L.recompute_is_cheaper, P._stored_for_externs, P._stored_in_forward
P._stored_in_forward = lambda *a: True
L.recompute_is_cheaper = lambda *a: False
os.environ["EMBER_CACHE_DIR"] = "/tmp/bnrecomp/cache_old_%d" % os.getpid()
P._stored_for_externs = lambda *a: False
ember.reset()
old = ember.compile(copy.deepcopy(m))
step(old); step(old)
L.recompute_is_cheaper, P._stored_for_externs, P._stored_in_forward = real, realp, realw
os.environ["EMBER_CACHE_DIR"] = "/tmp/bnrecomp/cache_part_%d" % os.getpid()
L.recompute_is_cheaper = lambda *a: False
ember.reset()
part = ember.compile(copy.deepcopy(m))
step(part); step(part)
L.recompute_is_cheaper = real
step(new); step(new); step(e)
fs = {"eager": e, "new": new, "old": old, "part": part}
ts = {k: [] for k in fs}
order = list(fs)
for r in range(reps):
    for k in (order if r % 2 == 0 else order[::-1]):
        t = time.perf_counter(); step(fs[k]); ts[k].append(time.perf_counter() - t)
def rat(a, b):
    r = [x / y for x, y in zip(ts[a], ts[b])]
    return "med %.3f [%.3f..%.3f]" % (st.median(r), min(r), max(r))
print(name, {k: round(st.median(v) * 1e3, 1) for k, v in ts.items()}, "eager/new", rat("eager", "new"),
      "eager/old", rat("eager", "old"), "old/new", rat("old", "new"), "part/new", rat("part", "new"), "old/part", rat("old", "part"), "load", os.getloadavg()[0], flush=True)

