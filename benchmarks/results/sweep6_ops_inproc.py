import os, time, statistics, torch, ember
torch.set_num_threads(1)
x = torch.randn(64, 8000) * 3
cases = {"exp": lambda x: torch.exp(x), "amax": lambda x: torch.amax(x, -1), "sumexp": lambda x: torch.exp(x - 1.0).sum(-1),
         "log_softmax": lambda x: torch.log_softmax(x, -1), "softmax": lambda x: torch.softmax(x, -1), "sum": lambda x: x.sum(-1)}
with torch.no_grad():
  for name, g in cases.items():
    f = ember.compile(lambda x, g=g: g(x))
    for _ in range(3): f(x); g(x)
    s = {"eager": [], "ember": []}
    for r in range(15):
        for k, fn in (("eager", g), ("ember", f)) if r % 2 == 0 else (("ember", f), ("eager", g)):
            t0 = time.thread_time()
            for _ in range(50): fn(x)
            s[k].append((time.thread_time() - t0) / 50 * 1e6)
    e, m = statistics.median(s["eager"]), statistics.median(s["ember"])
    print(f"{name:12s} eager {e:8.1f} us ember {m:8.1f} us  ratio {e/m:.2f}")
