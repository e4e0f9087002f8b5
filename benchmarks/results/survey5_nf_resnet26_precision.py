# survey5: nf_resnet26 training precision, ember vs aot_eager vs eager fp32 against fp64 (per-tensor norm-relative error).
# PYTHONPATH=. EMBER_SPEED_CHECK=0 python benchmarks/results/survey5_nf_resnet26_precision.py <n_stages 1-4> <backend ember|aot_eager>
import torch, copy, sys, timm
sys.path.insert(0, ".")
from ember.bench.harness import reduce_loss
import ember
torch.set_num_threads(1)
torch.manual_seed(0)
model = timm.create_model("nf_resnet26", pretrained=False)
k = int(sys.argv[1])
model.stages = model.stages[:k]
model.final_conv = torch.nn.Identity(); model.head = torch.nn.Identity()
model.train()
x = torch.randn(2, 3, 224, 224)
def step(m, a):
    out = m(a); loss = reduce_loss(out); loss.backward()
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}, out.detach()
g64, o64 = step(copy.deepcopy(model).double(), x.double())
g32, o32 = step(copy.deepcopy(model), x)
mc = copy.deepcopy(model); ember.compile(mc, backend=sys.argv[2]); gc, oc = step(mc, x)
def rel(a, b): return ((a.double() - b).norm() / (b.norm() + 1e-30)).item()
print(k, "out", rel(o32, o64), rel(oc, o64))
rows = sorted(((rel(gc[n], g64[n]), rel(g32[n], g64[n]), n, g64[n].norm().item()) for n in g64), reverse=True)
for r in rows[:4]: print("%.3g %.3g %s norm %.3g" % r)
