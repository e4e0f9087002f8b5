import torch, ember, sys, time, statistics
torch.set_num_threads(1)
H = int(sys.argv[1]); kind = sys.argv[2]; shape = eval(sys.argv[3]) if len(sys.argv) > 3 else (8, 512)
torch.manual_seed(0)
m = torch.nn.LayerNorm(H) if kind == "ln" else torch.nn.RMSNorm(H)
x = torch.randn(*shape, H, requires_grad=True)
g = torch.randn(*shape, H)
import copy
cm = ember.compile(copy.deepcopy(m))
def step(mod):
    y = mod(x); t0 = time.thread_time(); y.backward(g); return time.thread_time() - t0
def full(mod):
    t0 = time.thread_time(); y = mod(x); y.backward(g); return time.thread_time() - t0
for _ in range(3): full(m); full(cm)
# correctness
x.grad = None; m.zero_grad(); cm.zero_grad()
full(m); ge = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
x.grad = None; full(cm); gc = [x.grad.clone()] + [p.grad.clone() for p in cm.parameters()]
for a, b in zip(ge, gc): print("maxerr", (a-b).abs().max().item(), "scale", a.abs().max().item())
rat, rb = [], []
for r in range(int(sys.argv[4]) if len(sys.argv) > 4 else 15):
    e = full(m); c = full(cm); rat.append(e / c)
    e2 = step(m); c2 = step(cm); rb.append(e2 / c2)
q = lambda v: (statistics.median(v), statistics.quantiles(v, n=4)[0], statistics.quantiles(v, n=4)[2])
print(f"{kind} H={H} shape={shape}: fwd+bwd eager/ember %.3f [%.3f-%.3f]" % q(rat), " bwd only %.3f [%.3f-%.3f]" % q(rb))
