"""convtrain_opcpu.py MODEL [--variants eager,auto,nchw,cl] [--steps N] [--top K] [--mode train|infer]:
where a training (or inference) step's thread CPU time goes, per aten op (tagged with the layout of its first 4-D tensor argument:
nchw / cl / strided) and per ember kernel, averaged over N steps per variant (alternating), 1 thread.

eager: a TorchDispatchMode times each top-level aten call. ember (auto / nchw / cl = the layout
option): a dispatch mode would make ember's guards fall back to eager, so the wrapper's extern
calls are wrapped instead (WrapperCodegen.op_name) and its kernels timed through the EMBER_PROFILE
hook (`_rf`); a forward and a backward kernel with the same number share a row ("K ember kernelN").
Run with a fresh EMBER_CACHE_DIR and EMBER_BACKEND_CACHE=0 (a cached wrapper keeps the untimed ops).
Inductor is not covered (under a dispatch mode Dynamo runs the model eagerly). SHOWNCHW=1 prints
each NCHW conv call's shapes and strides."""
import copy, os, sys, time, statistics as st, collections, contextlib
os.environ["EMBER_PROFILE"] = "1"
os.environ.setdefault("EMBER_SPEED_CHECK", "0")
import torch
torch.set_num_threads(1)
import ember
from ember.codegen import wrapper as W
from ember.bench import suites  # noqa
from ember.bench.spec import REGISTRY
from ember.bench.harness import Runner
from torch.utils._python_dispatch import TorchDispatchMode
name = sys.argv[1]
arg = lambda k, d: sys.argv[sys.argv.index(k) + 1] if k in sys.argv else d
variants = arg("--variants", "eager,auto,torch").split(",")
steps, top = int(arg("--steps", 3)), int(arg("--top", 25))
mode = arg("--mode", "train")
OPTS = {"auto": {}, "nchw": {"layout": "contiguous"}, "cl": {"layout": "channels_last"}}
acc = None
class RF:
    def __init__(self, label): self.label = label
    def __enter__(self): self.t = time.thread_time()
    def __exit__(self, *a):
        if acc is not None:
            acc["K " + self.label.split(":")[0]] += time.thread_time() - self.t
def timed(op):
    nm = getattr(op, "__name__", str(op))
    def f(*a, **k):
        t = time.thread_time()
        r = op(*a, **k)
        if acc is not None:
            L = lay(list(a) + list(k.values()))
            acc["A %s %s" % (nm, L)] += time.thread_time() - t
            if "SHOWNCHW" in os.environ and L == "nchw" and "convolution" in nm:
                print("NCHW call", nm, [(tuple(x.shape), x.stride()) for x in a if isinstance(x, torch.Tensor)], "%.2f ms" % ((time.thread_time() - t) * 1e3))
        return r
    return f
_on = W.WrapperCodegen.op_name
def op_name(self, op):
    n = _on(self, op)
    self.globals[n] = timed(op)
    return n
W.WrapperCodegen.op_name = op_name
_g = W.wrapper_globals
W.wrapper_globals = lambda: {**_g(), "_rf": RF}
def lay(a):
    for t in a:
        if isinstance(t, torch.Tensor) and t.dim() == 4:
            if t.is_contiguous(): return "nchw"
            if t.is_contiguous(memory_format=torch.channels_last): return "cl"
            return "strided"
    return ""
class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = time.thread_time()
        r = func(*args, **(kwargs or {}))
        if acc is not None:
            acc["A %s %s" % (func.__name__, lay(args))] += time.thread_time() - t
        return r
spec = REGISTRY[name]
torch.manual_seed(0)
m = spec.build(); m.train(mode == "train"); args = spec.inputs(); kw = spec.kwargs()
rs = {}
for v in variants:
    mod = copy.deepcopy(m)
    f = mod if v == "eager" else torch.compile(mod) if v == "torch" else ember.compile(mod, options=OPTS[v])
    rs[v] = Runner(f, mod, mode, args, kw)
    for _ in range(2):
        rs[v].step()
res = {v: collections.defaultdict(float) for v in rs}
tot = {v: [] for v in rs}
order = list(rs)
for i in range(steps):
    for v in (order if i % 2 == 0 else order[::-1]):
        acc = collections.defaultdict(float)
        with (Mode() if v in ("eager", "torch") else contextlib.nullcontext()):
            t = time.thread_time(); rs[v].step(); tot[v].append(time.thread_time() - t)
        for k, x in acc.items(): res[v][k] += x / steps
        acc = None
print(name, "load %.1f" % os.getloadavg()[0], "steps", steps, "(under the dispatch mode) thread CPU ms median", {v: round(st.median(x) * 1e3, 1) for v, x in tot.items()})
for v in rs:
    r = res[v]
    a = sum(x for k, x in r.items() if k.startswith("A ")); kk = sum(x for k, x in r.items() if k.startswith("K "))
    print("== %s: step %.1f ms; aten ops %.1f, ember kernel labels %.1f (externs counted in both)" % (v, st.mean(tot[v]) * 1e3, a * 1e3, kk * 1e3))
    for k, x in sorted(r.items(), key=lambda kv: -kv[1])[:top]:
        print("   %8.2f ms  %s" % (x * 1e3, k))
