"""old (main's generated LN kernel, saved) vs new (this tree's) vs eager, kernel alone, paired."""
import os, sys, re, json, glob, statistics
sys.path.insert(0, "/work/wt-lnfwd/benchmarks"); sys.path.insert(0, "/work/wt-lnfwd")
import _timing
_timing.prepare()
os.environ["EMBER_SPEED_CHECK"] = "0"
import torch, torch.nn.functional as F, ember, ctypes
from ember.runtime.build import build
torch.set_num_threads(1)
shape = tuple(int(v) for v in sys.argv[1].split(","))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
N = shape[-1]; R = x_rows = 1
for s in shape[:-1]: R *= s
x = torch.randn(*shape); w = torch.randn(N); b = torch.randn(N)
fn = lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5)
f = ember.compile(fn)
with torch.no_grad(): f(x, w, b)
(path,) = glob.glob(os.path.join(os.environ["EMBER_CACHE_DIR"], "graphs", "*", "*.json"))
src = json.loads(json.load(open(path))["payload"])["source"]
i = src.index('extern "C" void kernel0')
head, new = src[:i], src[i:]
old = open(f"/tmp/lnfwd/old_{N}.cpp").read()
mean_b = torch.empty(R); rstd_b = torch.empty(R); out = torch.empty(*shape)
ref = fn(x, w, b)
fns = {"eager": lambda: fn(x, w, b)}
for k, body in (("old", old), ("new", new)):
    kf = ctypes.CDLL(str(build(head + body))).kernel0
    nargs = body[:body.index(")")].count(",") + 1
    kf.argtypes = [ctypes.c_void_p] * nargs; kf.restype = None
    ptrs = [x.data_ptr(), mean_b.data_ptr(), rstd_b.data_ptr(), w.data_ptr(), b.data_ptr(), out.data_ptr()] if nargs == 6 \
        else [x.data_ptr(), w.data_ptr(), b.data_ptr(), out.data_ptr()]
    kf(*ptrs)
    print(k, "max abs diff vs eager", (out - ref).abs().max().item())
    fns[k] = (lambda kf=kf, ptrs=ptrs: kf(*ptrs))
s, reps = _timing.paired(fns, (), rounds)
print(shape, "reps", reps, "load", os.getloadavg())
for k in s:
    r = _timing.ratio_stats(s["eager"], s[k])
    print(f"  {k}: {statistics.median(s[k])*1e3:.3f} ms  eager/{k} {r['median']:.2f} [{r['p25']:.2f}-{r['p75']:.2f}]")
r = _timing.ratio_stats(s["old"], s["new"])
print(f"  old/new {r['median']:.2f} [{r['p25']:.2f}-{r['p75']:.2f}] min-max {r['min']:.2f}-{r['max']:.2f}")
