"""Paired thread-time A/B of op_sweep patterns: eager vs ember, fwd-only / fwd+bwd."""
import sys, copy, time, statistics, torch, resource
sys.path.insert(0, "benchmarks")
import _timing; _timing.prepare()
import op_sweep as S
import ember, gc, os
GC = {"n": 0, "t": 0.0, "t0": 0.0, "gen": [0, 0, 0]}
def _cb(phase, info):
    if phase == "start": GC["t0"] = time.thread_time()
    else:
        GC["n"] += 1; GC["t"] += time.thread_time() - GC["t0"]; GC["gen"][info["generation"]] += 1
gc.callbacks.append(_cb)
torch.set_num_threads(1)
def run(name, mode, rounds=15, reps=None):
    ember.reset()
    torch.manual_seed(0)
    case = S.PATTERNS[name][0](1.0)
    m = S.Pattern(case); m.train(mode != "infer")
    cm = ember.compile(copy.deepcopy(m))
    xs = [x.clone().requires_grad_(mode != "infer") for x in case.inputs]
    g = None
    def step(mod):
        if mode == "infer":
            with torch.no_grad(): return mod(*xs)
        for x in xs: x.grad = None
        for p in mod.parameters(): p.grad = None
        out = mod(*xs)
        if mode == "fwd": return out
        out.backward(g)
    with torch.no_grad(): g = torch.randn_like(m(*xs))
    for _ in range(3): step(m); step(cm)
    if reps is None:
        t0 = time.thread_time(); step(m); reps = max(1, int(0.03 / max(time.thread_time() - t0, 1e-5)))
    te, tc = [], []
    we, wc = [], []
    if os.environ.get("FREEZE"): gc.collect(); gc.freeze()
    GC.update(n=0, t=0.0, gen=[0, 0, 0])
    flt = {id(m): 0, id(cm): 0}
    for r in range(rounds):
        for mod, lst in ((m, te), (cm, tc)) if r % 2 == 0 else ((cm, tc), (m, te)):
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            t0 = time.thread_time(); w0 = time.perf_counter()
            for _ in range(reps): step(mod)
            lst.append((time.thread_time() - t0) / reps * 1e3)
            (we if mod is m else wc).append((time.perf_counter() - w0) / reps * 1e3)
            flt[id(mod)] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
    if mode == "infer":
        oe, oc = step(m), step(cm)
        print("  x %x  eager out %x  ember out %x" % (xs[0].data_ptr() % 65536, oe.data_ptr() % 65536, oc.data_ptr() % 65536))
    print("  gc during timing: %d collections %s, %.1f ms" % (GC["n"], GC["gen"], GC["t"] * 1e3))
    wr = sorted(a / b for a, b in zip(we, wc)); q = len(wr) // 4
    print(f"  wall: eager {statistics.median(we):7.3f} ember {statistics.median(wc):7.3f} eager/ember {statistics.median(wr):.2f} [{wr[q]:.2f}-{wr[-q-1]:.2f}]")
    ratios = sorted(a / b for a, b in zip(te, tc))
    q = len(ratios) // 4
    print(f"{name:24s} {mode:5s} eager {statistics.median(te):7.3f} ms ember {statistics.median(tc):7.3f} ms  eager/ember {statistics.median(ratios):.2f} [{ratios[q]:.2f}-{ratios[-q-1]:.2f}]  faults/call e {flt[id(m)]/rounds/reps:.0f} c {flt[id(cm)]/rounds/reps:.0f}", flush=True)
for spec in sys.argv[1:]:
    n, mo = spec.split(":")
    run(n, mo)
