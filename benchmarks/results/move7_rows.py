"""Time op_sweep rows, eager vs ember, paired alternating, thread CPU time (1 thread).

Usage: TREE=/work/wt-move7 python move7_rows.py ROUNDS REGEX [MODE...]
Prints per row: CPU ms eager/ember and ember/eager speedup median [p25-p75] (> 1: ember faster).
"""
import os, sys, copy, re, statistics, time
sys.path.insert(0, os.path.join(os.environ.get("TREE", "/work/wt-move7"), "benchmarks"))
import torch
torch.set_num_threads(1)
import ember, op_sweep, _timing

rounds, rx = int(sys.argv[1]), sys.argv[2]
modes = sys.argv[3:] or ["infer", "train"]
for name in [n for n in op_sweep.PATTERNS if re.search(rx, n)]:
    build, trainable = op_sweep.PATTERNS[name]
    for mode in modes:
        if mode == "train" and not trainable:
            continue
        torch.manual_seed(0)
        case = build(float(os.environ.get("SCALE", "1.0")))
        base = op_sweep.Pattern(case); base.train(mode == "train")
        inputs = [x.clone() for x in case.inputs]
        if mode == "train":
            inputs = [x.requires_grad_() if x.is_floating_point() and i not in case.const else x
                      for i, x in enumerate(inputs)]
        ember.reset()
        comp = {"eager": base, "ember": ember.compile(copy.deepcopy(base))}
        grads = None
        if mode == "train":
            with torch.no_grad():
                outs = [o for o in op_sweep.flat(base(*inputs)) if o.requires_grad or o.is_floating_point()]
            g = torch.Generator().manual_seed(1)
            grads = [torch.randn(o.shape, generator=g) for o in outs]
        steps = {k: op_sweep.Step(m, inputs, mode, grads) for k, m in comp.items()}
        k0 = ember.stats()["counts"].get("kernels", 0)
        ref = steps["eager"].observed(steps["eager"]())
        got = steps["ember"].observed(steps["ember"]())
        err = op_sweep.max_rel_err(got, ref)
        nk = ember.stats()["counts"].get("kernels", 0) - k0
        s = {k: [] for k in steps}
        reps = max(1, int(0.04 / max(1e-6, min(_timing.time_call(steps["eager"]) for _ in range(3)))))
        for r in range(rounds):
            for k in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
                t0 = time.thread_time()
                for _ in range(reps):
                    steps[k]()
                s[k].append((time.thread_time() - t0) / reps)
        r = _timing.ratio_stats(s["eager"], s["ember"])
        print(f"{name:26s} {mode:5s} err {err:.1e} kernels {nk:2d}  CPU eager {statistics.median(s['eager'])*1e3:8.3f} ms"
              f" ember {statistics.median(s['ember'])*1e3:8.3f} ms  {r['median']:.2f} [{r['p25']:.2f}-{r['p75']:.2f}]",
              flush=True)
