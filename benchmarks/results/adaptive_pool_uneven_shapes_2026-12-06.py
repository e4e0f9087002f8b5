import torch, time, copy, ember, torch.nn.functional as F, statistics
torch.set_num_threads(1)
class M(torch.nn.Module):
    def __init__(s, o): super().__init__(); s.o = o
    def forward(self, x): return F.adaptive_avg_pool2d(x, self.o)
def bench(shape, o, cl):
    x = torch.randn(*shape)
    if cl: x = x.contiguous(memory_format=torch.channels_last)
    m = type("M%d" % id(shape), (M,), {"forward": lambda self, x: F.adaptive_avg_pool2d(x, self.o)})(o); c = ember.compile(copy.deepcopy(m))
    g = torch.randn_like(m(x))
    def step(f):
        xi = x.detach().clone().requires_grad_(); f(xi).backward(g)
    def inf(f):
        with torch.no_grad(): f(x)
    for f in (m, c): step(f); inf(f)
    out = []
    for name, fn in (("infer", inf), ("train", step)):
        r = {0: [], 1: []}
        for k in range(15):
            for i, f in ((0, m), (1, c)) if k % 2 else ((1, c), (0, m)):
                t = time.thread_time(); fn(f); r[i].append(time.thread_time() - t)
        ratios = sorted(a / b for a, b in zip(r[0], r[1]))
        out.append("%s %.2fx [%.2f-%.2f] (eager %.2f ms)" % (name, statistics.median(ratios), ratios[3], ratios[-4], statistics.median(r[0]) * 1e3))
    print(shape, o, "CL" if cl else "NCHW", " | ".join(out), flush=True)
import sys, ast
shape, o, cl = ast.literal_eval(sys.argv[1])
bench(shape, o, cl)
