import os, sys, copy
sys.path.insert(0, "benchmarks")
import torch
torch.set_num_threads(1)
import ember, op_sweep
build, _ = op_sweep.PATTERNS["basicblock_tail"]
torch.manual_seed(0)
case = build(float(os.environ.get("SCALE", "1.0")))
base = op_sweep.Pattern(case); base.train(True)
inputs = [x.clone().requires_grad_() for x in case.inputs]
cm = ember.compile(copy.deepcopy(base))
with torch.no_grad():
    outs = op_sweep.flat(base(*inputs))
g = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1)) for o in outs]
st = {k: op_sweep.Step(m, inputs, "train", g) for k, m in (("eager", base), ("ember", cm))}
ref = st["eager"].observed(st["eager"]()); got = st["ember"].observed(st["ember"]())
names = ["out", "x.grad", "r.grad"] + [n for n, _ in base.named_parameters()]
for n, a, b in zip(names, got, ref):
    print(n, tuple(a.shape), "%.3g" % op_sweep.max_rel_err([a], [b]))
print("bufs", [(n, "%.3g" % (a - b).abs().max().item()) for (n, a), (_, b) in zip(cm.named_buffers(), base.named_buffers())])
