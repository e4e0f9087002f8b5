"""hftrain_prof.py MODEL [--rounds N] [--top K] [--no-torch] [--no-prof] [--infer]: training steps
(bench Runner: forward, loss, backward, SGD; with --infer, eval-mode no_grad calls) of eager / ember / torch.compile, paired and alternating in
one process, timed by thread CPU time (1 thread); then one profiled step each: the top ops by
self CPU time (EMBER_PROFILE=1 names ember's kernels; Inductor's generated code is one event
per compiled graph, its externs are aten events)."""
import copy, os, sys, time, statistics as st
os.environ.setdefault("EMBER_PROFILE", "1")
import torch
torch.set_num_threads(1)
import ember
from ember.bench import suites  # noqa: registers
from ember.bench.spec import REGISTRY
from ember.bench.harness import Runner
from torch.profiler import profile

name = sys.argv[1]
arg = lambda k, d: int(sys.argv[sys.argv.index(k) + 1]) if k in sys.argv else d
rounds, top = arg("--rounds", 6), arg("--top", 30)
spec = REGISTRY[name]
torch.manual_seed(0)
mode = "infer" if "--infer" in sys.argv else "train"
m = spec.build(); m.train(mode == "train"); args = spec.inputs(); kw = spec.kwargs()
mods = {"eager": copy.deepcopy(m)}
if "--no-torch" not in sys.argv:
    mods["torch"] = copy.deepcopy(m)
mods["ember"] = m
rs = {}
for k, mod in mods.items():
    f = mod if k == "eager" else ember.compile(mod) if k == "ember" else torch.compile(mod)
    rs[k] = Runner(f, mod, mode, args, kw)
    for _ in range(2):
        rs[k].step()
cpu = {k: [] for k in rs}
order = list(rs)
for i in range(rounds):
    for k in (order if i % 2 == 0 else order[::-1]):
        c0 = time.thread_time(); rs[k].step(); cpu[k].append(time.thread_time() - c0)
print(name, "load %.1f" % os.getloadavg()[0], "rounds", rounds, "thread CPU ms",
      {k: round(st.median(v) * 1e3, 1) for k, v in cpu.items()})
for k in rs:
    if k != "eager":
        rat = sorted(a / b for a, b in zip(cpu["eager"], cpu[k]))
        print("  eager/%s med %.3f [min %.3f max %.3f]" % (k, st.median(rat), rat[0], rat[-1]))
if "--no-prof" in sys.argv:
    sys.exit()
import collections
#: self-time categories of the shares line (first match wins; the profiler's times are wall
#: times, inflated alike under load, so read the shares, not the milliseconds); ember's kernels
#: first, as their names carry the aten ops they fuse
CATEGORIES = [("ember kernels", ("ember kernel",)),
              ("gemm", ("_linear_pointwise", "aten::addmm", "aten::mm", "aten::bmm", "_mkl_linear",
                        "aten::baddbmm")),
              ("attention", ("flash_attention", "ember::flex_attention", "ember::sdpa_infer")),
              ("conv", ("convolution",)), ("rnn", ("rnn",))]
steps = arg("--steps", 5)
per = {k: collections.defaultdict(list) for k in rs}
tot = {k: [] for k in rs}
for i in range(steps):                  # several profiled steps, alternating: per-op medians
    for k in (order if i % 2 == 0 else order[::-1]):
        with profile(record_shapes="--shapes" in sys.argv) as p:
            rs[k].step()
        evs = p.key_averages(group_by_input_shape="--shapes" in sys.argv)
        tot[k].append(sum(ev.self_cpu_time_total for ev in evs) / 1e3)
        for ev in evs:
            shp = (" " + str(ev.input_shapes)[:100]) if "--shapes" in sys.argv else ""
            per[k]["%4d  %s%s" % (ev.count, ev.key[:100], shp)].append(ev.self_cpu_time_total / 1e3)
for k in rs:
    print("== %s: total self CPU per step, median %.1f ms [min %.1f]" % (k, st.median(tot[k]), min(tot[k])))
    rows = sorted(per[k].items(), key=lambda kv: -st.median(kv[1]))
    for cls in ("ember kernel", "CompiledFxGraph", "EmberCompiledFunction", "aten::fill_", "aten::mm", "aten::addmm", "flash", "aten::copy_", "aten::add_"):
        sel = [v for key, v in rows if cls in key]
        if sel:
            print("  %-22s %3d events: sum of medians %7.1f ms, sum of mins %7.1f ms" % (cls, len(sel), sum(st.median(v) for v in sel), sum(min(v) for v in sel)))
    share = collections.Counter()       # where the step's self time goes, by library / ember
    for key, v in rows:
        share[next((c for c, names in CATEGORIES if any(n in key for n in names)), "other")] += \
            st.median(v)
    total = sum(share.values()) or 1.0
    print("  shares: " + ", ".join("%s %.0f%%" % (c, 100 * share[c] / total)
                                   for c, _ in CATEGORIES + [("other", ())] if share[c]))
    for key, v in rows[:top]:
        print("%9.2f ms [min %7.2f] %s" % (st.median(v), min(v), key))
