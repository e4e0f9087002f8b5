import os, sys, time, copy, statistics, torch, ember
torch.set_num_threads(1)
torch.manual_seed(0)
cases = {
 "ln768": (lambda: torch.nn.LayerNorm(768), (8, 512, 768)),
 "rms768": (lambda: torch.nn.RMSNorm(768), (8, 512, 768)),
 "ln64": (lambda: torch.nn.LayerNorm(64), (8 * 3136, 64)),
}
for name in sys.argv[1].split(","):
    mk, shape = cases[name]
    m = mk(); cm = ember.compile(copy.deepcopy(m))
    x = torch.randn(*shape); g = torch.randn(*shape)
    def step(mod):
        xx = x.detach().requires_grad_()
        for p in mod.parameters(): p.grad = None
        mod(xx).backward(g)
    for _ in range(3): step(m); step(cm)
    te, tc = [], []
    for r in range(15):
        for mod, lst in ((m, te), (cm, tc)) if r % 2 == 0 else ((cm, tc), (m, te)):
            t0 = time.perf_counter()
            for _ in range(5): step(mod)
            lst.append((time.perf_counter() - t0) / 5 * 1e3)
    ratios = sorted(a / b for a, b in zip(te, tc))
    print(f"{name}: eager {statistics.median(te):.2f} ms ember {statistics.median(tc):.2f} ms ratio {statistics.median(ratios):.2f} [{ratios[3]:.2f}-{ratios[-4]:.2f}]")
