"""Time one op_sweep pattern: eager vs ember, paired; EMBER_DEBUG_DIR to dump."""
import os, sys, copy, statistics, time
sys.path.insert(0, os.path.join(os.environ.get("TREE", "/work/wt-sweep4"), "benchmarks"))
import torch
torch.set_num_threads(1)
import ember, op_sweep, _timing
name, mode = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
build, _ = op_sweep.PATTERNS[name]
torch.manual_seed(0)
case = build(float(os.environ.get("SCALE", "1.0")))
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
if rounds and os.environ.get("CPU_TIME"):
    # thread CPU time (one thread): robust to other processes taking the core
    s = {k: [] for k in steps}
    reps = max(1, int(0.04 / max(1e-6, min(_timing.time_call(steps["eager"]) for _ in range(3)))))
    for r in range(rounds):
        for k in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            t0 = time.thread_time()
            for _ in range(reps):
                steps[k]()
            s[k].append((time.thread_time() - t0) / reps)
    r = _timing.ratio_stats(s["eager"], s["ember"])
    print(name, mode, "CPU eager %.3f ms ember %.3f ms" % (statistics.median(s["eager"])*1e3, statistics.median(s["ember"])*1e3), "%.2f [%.2f-%.2f]" % (r["median"], r["p25"], r["p75"]))
elif rounds:
    s, reps = _timing.paired(steps, (), rounds, target_s=0.04)
    r = _timing.ratio_stats(s["eager"], s["ember"])
    print(name, mode, "eager %.3f ms ember %.3f ms" % (statistics.median(s["eager"])*1e3, statistics.median(s["ember"])*1e3), "%.2f [%.2f-%.2f]" % (r["median"], r["p25"], r["p75"]))
