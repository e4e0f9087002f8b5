"""Paired A/B of a training step in one process: eager vs ember vs ember with the per-channel
lane rule off (lowering.SMALL_LANE_OPS, docs/design/059), optionally Inductor (--torch).

python benchmarks/bnclast_ab.py MODEL [--rounds N] [--torch]
--old-captured: the old variant also keeps the captured layout (options layout=contiguous: what a
graph whose meta run failed got before the layout fix of docs/design/059).
--kernels: also the thread CPU time per step in ember's generated kernels (EMBER_PROFILE hooks),
per variant, and the 6 largest kernels of each.
MODEL: a broad-suite name (b_tv_resnet50, ...) or block:N,C,H,W (conv-BN-ReLU x2, channels-last).
Thread CPU time per step (1 thread, _timing.paired: alternating order), EMBER_SPEED_CHECK=0 (ember's
own kernels). Prints the medians (ms) and per-round ratios eager/X: median [min..max]."""
import copy, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import prepare, paired, ratio_stats
tmp = prepare()
os.environ["EMBER_BACKEND_CACHE"] = "0"
os.environ.setdefault("EMBER_SPEED_CHECK", "0")
KERNELS = "--kernels" in sys.argv
if KERNELS:
    os.environ["EMBER_PROFILE"] = "1"
import collections
import time
import statistics as st
import torch
torch.set_num_threads(1)
import ember
import ember.lower.lowering as L
from ember.codegen import wrapper as W

acc = {"cur": None}


class RF:
    """Times one generated kernel (the wrapper's `with _rf(label):`) into the running variant."""
    def __init__(self, label):
        self.label = label

    def __enter__(self):
        self.t = time.thread_time()

    def __exit__(self, *a):
        if acc["cur"] is not None:
            acc["cur"][self.label.split(":")[0]] += time.thread_time() - self.t


_globals = W.wrapper_globals
W.wrapper_globals = lambda: {**_globals(), "_rf": RF}

name = sys.argv[1]
arg = lambda k, d: sys.argv[sys.argv.index(k) + 1] if k in sys.argv else d
rounds = int(arg("--rounds", 9))
torch.manual_seed(0)
if name.startswith("block:"):
    N, C, H, W = map(int, name[6:].split(","))
    cl = torch.channels_last
    m = torch.nn.Sequential(torch.nn.Conv2d(C, C, 3, padding=1, bias=False), torch.nn.BatchNorm2d(C),
                            torch.nn.ReLU(), torch.nn.Conv2d(C, C, 3, padding=1, bias=False),
                            torch.nn.BatchNorm2d(C), torch.nn.ReLU()).to(memory_format=cl)
    args, kw = (torch.randn(N, C, H, W).to(memory_format=cl),), {}
else:
    from ember.bench import suites  # noqa: F401
    from ember.bench.spec import REGISTRY
    spec = REGISTRY[name]
    m = spec.build().train()
    args, kw = spec.inputs(), spec.kwargs()


def out0(o):
    if isinstance(o, torch.Tensor):
        return o
    if isinstance(o, dict):
        return out0(next(iter(o.values())))
    return out0(o.logits if hasattr(o, "logits") else o[0])


kern = {}


def stepper(f, label=None):
    def step():
        acc["cur"] = kern.setdefault(label, collections.Counter()) if label else None
        out0(f(*args, **kw)).float().mean().backward()
        acc["cur"] = None
    return step


fns = {"eager": stepper(copy.deepcopy(m)), "new": stepper(ember.compile(copy.deepcopy(m)), "new")}
fns["new"](); fns["new"]()
real = L.SMALL_LANE_OPS
L.SMALL_LANE_OPS = 10 ** 9
ember.reset()
opts = {"layout": "contiguous"} if "--old-captured" in sys.argv else {}
fns["old"] = stepper(ember.compile(copy.deepcopy(m), options=opts), "old")
fns["old"](); fns["old"]()
L.SMALL_LANE_OPS = real
if "--torch" in sys.argv:
    fns["torch"] = stepper(torch.compile(copy.deepcopy(m)))
    fns["torch"](); fns["torch"]()
for f in fns.values():      # ember.reset() dropped new's cache: it recompiles here, untimed
    f()
load0 = os.getloadavg()[0]
kern.clear()
ts, reps = paired(fns, rounds=rounds, reps=1)
print(name, "ms", {k: round(st.median(v) * 1e3, 2) for k, v in ts.items()}, flush=True)
for k in ts:
    if k != "eager":
        r = ratio_stats(ts["eager"], ts[k])
        print("  eager/%s %.3f [%.3f..%.3f]" % (k, r["median"], r["min"], r["max"]))
r = ratio_stats(ts["old"], ts["new"])
print("  old/new %.3f [%.3f..%.3f]" % (r["median"], r["min"], r["max"]))
if "torch" in ts:
    r = ratio_stats(ts["torch"], ts["new"])
    print("  torch/new %.3f [%.3f..%.3f]" % (r["median"], r["min"], r["max"]))
print("  load %.1f -> %.1f, rounds %d, clock thread CPU, EMBER_SPEED_CHECK=%s" % (
    load0, os.getloadavg()[0], rounds, os.environ["EMBER_SPEED_CHECK"]), flush=True)
if KERNELS:
    for k, c in kern.items():
        tot = sum(c.values()) / rounds * 1e3
        top = ", ".join("%s %.2f" % (n, t / rounds * 1e3) for n, t in c.most_common(6))
        print("  %s kernels %.2f ms/step: %s" % (k, tot, top))
