import torch, ember, time, statistics, copy, sys
torch.set_num_threads(1); torch.manual_seed(0)
H = int(sys.argv[1])
m = torch.nn.LayerNorm(H); x = torch.randn(8, 512, H, requires_grad=True)
cm = ember.compile(copy.deepcopy(m))
def fwd(mod):
    t0 = time.thread_time(); y = mod(x); t = time.thread_time() - t0; del y; return t
for _ in range(3): fwd(m); fwd(cm)
r = [fwd(m) / fwd(cm) for _ in range(21)]
q = statistics.quantiles(r, n=4)
e=[fwd(m) for _ in range(11)]; c=[fwd(cm) for _ in range(11)]
print("abs ms eager", statistics.median(e)*1e3, "ember", statistics.median(c)*1e3, "ns/elem eager", statistics.median(e)*1e9/x.numel())
print(f"LN{H} training forward eager/ember {statistics.median(r):.3f} [{q[0]:.3f}-{q[2]:.3f}]")
