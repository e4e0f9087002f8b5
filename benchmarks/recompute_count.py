"""Design 039 structure count: python benchmarks/recompute_count.py MODEL -> kernels and bytes stored, per variant (EMBER_DEBUG_DIR under /tmp/bnrecomp)."""
"""Backward of a model: kernels, and bytes the kernels store (full-size buffers), new vs old rules."""
import os, sys, re, copy, math, glob
os.environ["EMBER_BACKEND_CACHE"] = "0"; os.environ["EMBER_SPEED_CHECK"] = "0"
import torch
import ember, ember.lower.lowering as L, ember.aot
P = sys.modules["ember.aot.partition"]
from ember.bench import suites  # noqa
from ember.bench.spec import REGISTRY
spec = REGISTRY[sys.argv[1]]
torch.manual_seed(0)
m = spec.build().train()
args = spec.inputs()
args = tuple(a[:1] if isinstance(a, torch.Tensor) else a for a in args)   # batch 1: same kernels
def run(tag, patch):
    d = f"/tmp/bnrecomp/cnt_{tag}"
    os.system(f"rm -rf {d}"); os.environ["EMBER_DEBUG_DIR"] = d
    os.environ["EMBER_CACHE_DIR"] = f"/tmp/bnrecomp/cache_{tag}_{os.getpid()}"
    real, realp, realw = L.recompute_is_cheaper, P._stored_for_externs, P._stored_in_forward
    if patch:
        L.recompute_is_cheaper = lambda *a: False
    if patch == "all":      # main before design 039: none of its three rules
        P._stored_for_externs = lambda *a: False
        P._stored_in_forward = lambda *a: True
    ember.reset()
    c = ember.compile(copy.deepcopy(m))
    c(*args).float().mean().backward()
    L.recompute_is_cheaper, P._stored_for_externs, P._stored_in_forward = real, realp, realw
    for part, lower, sched in (("fwd", "*_lower.py", "*_schedule.py"), ("bwd", "*backward_lower.py", "*backward_schedule.py")):
        lf = [f for f in glob.glob(f"{d}/*/{lower}") if part == "bwd" or "backward" not in f]
        sf = [f for f in glob.glob(f"{d}/*/{sched}") if part == "bwd" or "backward" not in f]
        lo = "\n".join(open(f).read() for f in lf); sc = "\n".join(open(f).read() for f in sf)
        local = set(re.findall(r"kernel-local: (.*)", sc)); local = {b for l in local for b in l.split()}
        total = 0
        for name, dims in re.findall(r"def (buf\d+)\(.*?# \w+(?: \w+)? -> float32\[([\d, ]*)\]", lo):
            if name not in local:
                total += math.prod(int(x) for x in dims.split(",") if x.strip()) * 4
        nk = sum(int(x) for x in re.findall(r"after schedule: (\d+) kernels", sc))
        print(tag, part, "kernels", nk, "stored MB %.1f" % (total / 2**20))
run("new", False)
run("part", "recompute")
run("old", "all")
