"""hftrain_ab.py MODEL [--rounds N] [--no-mask] [--torch]: paired alternating training steps
(bench Runner: forward, loss, backward, SGD) of eager / ember / ember as before the sdpa change
(grouped-query sdpa declined, each boolean mask converted per call) [/ torch.compile]; thread
CPU time per step, 1 thread; medians and paired ratios. --no-mask drops the attention_mask input
(transformers then calls sdpa with is_causal and, for GQA models, enable_gqa)."""
import copy, os, sys, time, statistics as st
import torch
torch.set_num_threads(1)
import ember
import ember.aot.tracer as tracer
from ember.aot.attention import cpu_sdpa
from ember.bench import suites  # noqa: registers
from ember.bench.spec import REGISTRY
from ember.bench.harness import Runner

name = sys.argv[1]
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 8
spec = REGISTRY[name]
torch.manual_seed(0)
m = spec.build(); m.train(True); args = spec.inputs(); kw = spec.kwargs()
if "--no-mask" in sys.argv:
    kw = {k: v for k, v in kw.items() if k != "attention_mask"}
rs = {}
def add(k, mod, f):
    rs[k] = Runner(f, mod, "train", args, kw)
    for _ in range(2):
        rs[k].step()
e, old, t = copy.deepcopy(m), copy.deepcopy(m), copy.deepcopy(m)
add("eager", e, e)
add("new", m, ember.compile(m))
def before(*a, enable_gqa=False, float_masks=None, **k):
    return None if enable_gqa else cpu_sdpa(*a, **k)
tracer.cpu_sdpa = before
add("old", old, ember.compile(old))
tracer.cpu_sdpa = cpu_sdpa
if "--torch" in sys.argv:
    add("torch", t, torch.compile(t))
cpu = {k: [] for k in rs}
order = list(rs)
for i in range(rounds):
    for k in (order if i % 2 == 0 else order[::-1]):
        c0 = time.thread_time(); rs[k].step(); cpu[k].append(time.thread_time() - c0)
print(name, "no-mask" if "--no-mask" in sys.argv else "mask", "load %.1f" % os.getloadavg()[0],
      "rounds", rounds, "thread CPU ms", {k: round(st.median(v) * 1e3, 1) for k, v in cpu.items()})
def ratio(a, b):
    r = sorted(x / y for x, y in zip(cpu[a], cpu[b]))
    print("  %s/%s med %.3f [p25 %.3f p75 %.3f]" % (a, b, st.median(r), r[len(r) // 4], r[(3 * len(r)) // 4]))
for k in rs:
    if k != "eager":
        ratio("eager", k)
ratio("old", "new")
