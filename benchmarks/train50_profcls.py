"""profcls.py MODEL [--steps N] [--no-torch] [--top K]: per-class self CPU time (ms per step, median
over N profiled steps taken in alternating order) of eager / ember / torch.compile training steps."""
import copy, os, sys, time, statistics as st, collections, re
os.environ.setdefault("EMBER_PROFILE", "1")
import torch
torch.set_num_threads(1)
import ember
from ember.bench import suites  # noqa
from ember.bench.spec import REGISTRY
from torch.profiler import profile
name = sys.argv[1]
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 4
top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 12
spec = REGISTRY[name]; torch.manual_seed(0)
m = spec.build(); m.train(True); args = spec.inputs(); kw = spec.kwargs()
fs = {"eager": copy.deepcopy(m)}
if "--no-torch" not in sys.argv:
    fs["torch"] = torch.compile(copy.deepcopy(m))
fs["ember"] = ember.compile(m)
def out0(o):
    return o if isinstance(o, torch.Tensor) else out0(o[0])
def step(k):
    f = fs[k]
    for p in f.parameters(): p.grad = None
    out0(f(*args, **kw)).float().mean().backward()
for _ in range(2):
    for k in fs: step(k)
CLASSES = [("conv_fwd", r"^aten::(mkldnn_convolution|_slow_conv2d_forward|convolution|_convolution|thnn_conv2d|conv2d)$"),
           ("conv_bwd", r"^aten::(convolution_backward|_slow_conv2d_backward|mkldnn_convolution_backward)$"),
           ("kernels", r"^(ember kernel|## Call CompiledFxGraph)"),
           ("copy", r"^aten::(copy_|_to_copy|clone|contiguous)$"),
           ("fill", r"^aten::(fill_|zero_|zeros)$"),
           ("mm", r"^aten::(mm|addmm|bmm)$"),
           ("bn", r"batch_norm"), ("relu", r"threshold|relu|clamp"), ("pool", r"pool"),
           ("add", r"^aten::add"), ("alloc", r"^aten::(empty|empty_strided|resize_|empty_like)$")]
per = {k: collections.defaultdict(list) for k in fs}
wall = {k: [] for k in fs}
kern = {k: collections.defaultdict(list) for k in fs}
order = list(fs)
for r in range(steps):
    for k in (order if r % 2 == 0 else order[::-1]):
        with profile() as p:
            t = time.perf_counter(); step(k); wall[k].append((time.perf_counter() - t) * 1e3)
        acc = collections.Counter()
        for ev in p.key_averages():
            cls = next((c for c, rx in CLASSES if re.search(rx, ev.key)), "other")
            acc[cls] += ev.self_cpu_time_total / 1e3
            if cls in ("kernels", "other", "copy"):
                kern[k][ev.key[:90]].append(ev.self_cpu_time_total / 1e3)
        acc["TOTAL"] = sum(acc.values())
        for c, v in acc.items(): per[k][c].append(v)
print(name, "load", os.getloadavg()[0], "profiled wall ms", {k: round(st.median(v), 1) for k, v in wall.items()})
cls = [c for c, _ in CLASSES] + ["other", "TOTAL"]
print("%-10s" % "class", *("%16s" % k for k in fs))
for c in cls:
    print("%-10s" % c, *("%16s" % ("%.1f [%.0f-%.0f]" % (st.median(per[k][c]), min(per[k][c]), max(per[k][c])) if per[k][c] else "-") for k in fs))
for k in fs:
    if k == "eager": continue
    print("== top kernels/copies/other", k)
    for key, v in sorted(kern[k].items(), key=lambda kv: -st.median(kv[1]))[:top]:
        print("  %8.2f ms  %s" % (st.median(v), key))
for c in ("conv_fwd", "conv_bwd", "TOTAL"):
    for k in fs:
        print(c, k, [round(x) for x in per[k][c]])
