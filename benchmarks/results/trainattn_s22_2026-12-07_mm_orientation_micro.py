import torch, time, statistics as st
torch.set_num_threads(1)
M, K, N = 1500, 384, 384
W = torch.randn(N, K)
G = torch.randn(M, N)
Xc = torch.randn(M, K); Xt = torch.randn(K, M).t()
fs = {"wgrad_eager Gt@Xc": lambda: torch.mm(G.t(), Xc),
      "wgrad_ember Gt@Xt": lambda: torch.mm(G.t(), Xt),
      "igrad_eager G@W": lambda: torch.mm(G, W),
      "igrad_ember Wt@Gt": lambda: torch.mm(W.t(), G.t()),
      "fwd Xt@Wt": lambda: torch.mm(Xt, W.t()),
      "fwd Xc@Wt": lambda: torch.mm(Xc, W.t())}
res = {k: [] for k in fs}
for r in range(15):
    for k, f in fs.items():
        t = time.thread_time()
        for _ in range(10): f()
        res[k].append((time.thread_time() - t) / 10 * 1e3)
for k, v in res.items():
    print("%-20s median %.3f ms  min %.3f" % (k, st.median(v), min(v)))
