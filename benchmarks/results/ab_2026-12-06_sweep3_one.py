"""Time one op_sweep pattern: eager vs ember, paired; optionally dump debug dir."""
import os, sys, copy, statistics, time
sys.path.insert(0, "/work/wt-sweep3/benchmarks")
import torch
torch.set_num_threads(1)
import ember, op_sweep, _timing
name, mode = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
build, _ = op_sweep.PATTERNS[name]
torch.manual_seed(0)
case = build(1.0)
base = op_sweep.Pattern(case); base.train(mode == "train")
inputs = [x.clone() for x in case.inputs]
if mode == "train":
    inputs = [x.requires_grad_() if x.is_floating_point() and i not in case.const else x for i, x in enumerate(inputs)]
comp = {"eager": base, "ember": ember.compile(copy.deepcopy(base))}
grads = None
if mode == "train":
    with torch.no_grad():
        outs = [o for o in op_sweep.flat(base(*inputs)) if o.requires_grad or o.is_floating_point()]
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(o.shape, generator=g) for o in outs]
steps = {k: op_sweep.Step(m, inputs, mode, grads) for k, m in comp.items()}
ref = steps["eager"].observed(steps["eager"]())
got = steps["ember"].observed(steps["ember"]())
print("err", op_sweep.max_rel_err(got, ref), ember.stats()["counts"].get("kernels"))
s, reps = _timing.paired(steps, (), rounds, target_s=0.04)
r = _timing.ratio_stats(s["eager"], s["ember"])
print(name, mode, "eager %.3f ms ember %.3f ms" % (statistics.median(s["eager"])*1e3, statistics.median(s["ember"])*1e3), r)
