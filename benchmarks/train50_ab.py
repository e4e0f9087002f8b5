"""ab_oldnew.py MODEL [--rounds N]: paired alternating training steps (bench Runner: fwd, bwd, SGD)
of eager / ember with this tree's avg-pool decompositions / ember with them declined (main's
aten externs) / torch.compile; per-step thread CPU time; medians and paired ratios."""
import copy, os, sys, time, statistics as st
import torch
torch.set_num_threads(1)
import ember
from ember.bench import suites  # noqa
from ember.bench.spec import REGISTRY
from ember.bench.harness import Runner
from ember.decomp.registry import DECOMPS
aten = torch.ops.aten
name = sys.argv[1]
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 8
spec = REGISTRY[name]; torch.manual_seed(0)
m = spec.build(); m.train(True); args = spec.inputs(); kw = spec.kwargs()
e = copy.deepcopy(m)
rs = {"eager": Runner(e, e, "train", args, kw)}
def add(k, f, mod):
    rs[k] = Runner(f, mod, "train", args, kw); rs[k].step()
m_new, m_old, m_t = copy.deepcopy(m), copy.deepcopy(m), copy.deepcopy(m)
add("new", ember.compile(m_new), m_new)
for op in (aten.avg_pool2d.default, aten.avg_pool2d_backward.default):
    DECOMPS[op] = lambda *a, **k: NotImplemented
add("old", ember.compile(m_old), m_old)
if "--torch" in sys.argv: add("torch", torch.compile(m_t), m_t)
for _ in range(2):
    for r in rs.values(): r.step()
cpu = {k: [] for k in rs}; order = list(rs)
for i in range(rounds):
    for k in (order if i % 2 == 0 else order[::-1]):
        c0 = time.thread_time(); rs[k].step(); cpu[k].append(time.thread_time() - c0)
print(name, "load %.1f" % os.getloadavg()[0], "rounds", rounds, "thread CPU ms",
      {k: round(st.median(v) * 1e3, 1) for k, v in cpu.items()})
for k in rs:
    if k == "eager": continue
    rat = sorted(a / b for a, b in zip(cpu["eager"], cpu[k]))
    print("  eager/%s med %.3f [p25 %.3f p75 %.3f]" % (k, st.median(rat), rat[len(rat) // 4], rat[(3 * len(rat)) // 4]))
rat = sorted(a / b for a, b in zip(cpu["old"], cpu["new"]))
print("  old/new med %.3f [p25 %.3f p75 %.3f]" % (st.median(rat), rat[len(rat) // 4], rat[(3 * len(rat)) // 4]))
