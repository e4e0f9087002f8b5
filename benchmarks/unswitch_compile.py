"""Cold compile seconds of one survey model (default HF Mamba) on several ember trees, each run in
a fresh process with an empty EMBER_CACHE_DIR, trees alternating, 1 thread, inference under
no_grad: first call minus the median steady call (wall), and the CPU seconds of the first call
(this process and its g++ children: on a loaded box wall time is mostly waiting). Also the
generated C++ bytes and the wall seconds spent in g++ builds (they run in a thread pool). Unswitching (design 037)
emits a loop nest per segment combination: its cost shows in both.

    python benchmarks/unswitch_compile.py --tree /work/main --tree . [--model s_hf_mamba] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import sys, time, json, statistics, resource, torch
sys.path.insert(0, sys.argv[2] + "/benchmarks")
import survey
from ember.bench import suites
from ember.runtime import build as B
import ember
torch.set_num_threads(1)
spent = {"gcc": 0.0, "bytes": 0, "builds": 0}
real = B.build
def timed(source, *a, **k):      # measurement only: the time of each g++ run (cache misses)
    t = time.perf_counter(); r = real(source, *a, **k)
    spent["gcc"] += time.perf_counter() - t; spent["bytes"] += len(source); spent["builds"] += 1
    return r
B.build = timed
spec = survey.SPECS[sys.argv[1]]
model, args, kwargs = suites.instantiate(spec)
model.eval()
comp = ember.compile(model)
with torch.no_grad():
    def cpu():
        return sum(x.ru_utime + x.ru_stime for x in
                   (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))
    c0, gcc0 = cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter(); comp(*args, **kwargs); first = time.perf_counter() - t
    c1, gcc1 = cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
    steady = []
    for _ in range(3):
        t = time.perf_counter(); comp(*args, **kwargs); steady.append(time.perf_counter() - t)
print(json.dumps({"compile": first - statistics.median(steady), "cpu": c1 - c0,
                  "gcc_cpu": gcc1.ru_utime + gcc1.ru_stime - gcc0.ru_utime - gcc0.ru_stime, **spent}))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tree", action="append", required=True)
    ap.add_argument("--model", default="s_hf_mamba")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = {os.path.abspath(t): [] for t in a.tree}
    for r in range(a.rounds):
        for tree in (a.tree if r % 2 == 0 else a.tree[::-1]):
            tree = os.path.abspath(tree)
            env = dict(os.environ, EMBER_CACHE_DIR=tempfile.mkdtemp(prefix="uc_"), PYTHONPATH=tree,
                       OMP_NUM_THREADS="1", EMBER_SPEED_CHECK="0",
                       MALLOC_MMAP_THRESHOLD_="4294967296", MALLOC_TRIM_THRESHOLD_="68719476736")
            p = subprocess.run([sys.executable, "-c", CHILD, a.model, tree], env=env, cwd=tree,
                               capture_output=True, text=True, timeout=1200)
            try:
                got = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                got = {"err": p.stderr[-600:]}
            got.update(tree=tree, round=r)
            print(json.dumps(got), flush=True)
            rows[tree].append(got)
    for tree, rs in rows.items():
        ok = [x for x in rs if "compile" in x]
        if ok:
            print(f"{tree}: compile median {statistics.median(x['compile'] for x in ok):.1f} s "
                  f"[{min(x['compile'] for x in ok):.1f}-{max(x['compile'] for x in ok):.1f}], "
                  f"cpu {statistics.median(x['cpu'] for x in ok):.1f} s "
                  f"[{min(x['cpu'] for x in ok):.1f}-{max(x['cpu'] for x in ok):.1f}], "
                  f"g++ cpu {statistics.median(x['gcc_cpu'] for x in ok):.1f} s, "
                  f"C++ {statistics.median(x['bytes'] for x in ok) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
