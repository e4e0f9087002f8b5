"""hftrain_layout_ab.py MODEL [--rounds N]: training steps (bench Runner) of eager / ember (its
layout plan) / ember with options={"layout": "contiguous"} (NCHW), paired alternating, thread CPU
time, 1 thread: does the training layout rule pick the faster layout for this row?"""
import copy, os, sys, time, statistics as st
import torch
torch.set_num_threads(1)
import ember
from ember.bench import suites  # noqa: registers
from ember.bench.spec import REGISTRY
from ember.bench.harness import Runner
name = sys.argv[1]
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 6
spec = REGISTRY[name]; torch.manual_seed(0)
m = spec.build(); m.train(True); args = spec.inputs(); kw = spec.kwargs()
e, c = copy.deepcopy(m), copy.deepcopy(m)
rs = {"eager": Runner(e, e, "train", args, kw),
      "plan": Runner(ember.compile(m), m, "train", args, kw),
      "nchw": Runner(ember.compile(c, options={"layout": "contiguous"}), c, "train", args, kw)}
for r in rs.values():
    r.step(); r.step()
cpu = {k: [] for k in rs}; order = list(rs)
for i in range(rounds):
    for k in (order if i % 2 == 0 else order[::-1]):
        c0 = time.thread_time(); rs[k].step(); cpu[k].append(time.thread_time() - c0)
print(name, "load %.1f" % os.getloadavg()[0], "rounds", rounds, "thread CPU ms",
      {k: round(st.median(v) * 1e3, 1) for k, v in cpu.items()})
for a, b in (("eager", "plan"), ("eager", "nchw"), ("nchw", "plan")):
    r = sorted(x / y for x, y in zip(cpu[a], cpu[b]))
    print("  %s/%s med %.3f [min %.3f max %.3f]" % (a, b, st.median(r), r[0], r[-1]))
