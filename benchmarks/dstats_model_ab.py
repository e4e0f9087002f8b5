"""Eager vs ember per training (or inference) step of bench models, thread CPU, in one process.

    python benchmarks/dstats_model_ab.py MODEL[,MODEL] [--tree DIR] [--mode train|infer]
        [--rounds N]

Run it alternately with --tree pointing at two checkouts (main and a branch) to A/B them: the
tree's ember and benchmarks/_timing.py are imported (its prepare() puts the tree first on
sys.path and re-executes with the allocator settings); each process builds the model (seeded), compiles it with ember (EMBER_SPEED_CHECK=0: ember's own
kernels, EMBER_BACKEND_CACHE=0, fresh caches), and times eager and ember steps in alternating
order (_timing.paired, 1 thread); prints one line per model: medians (ms), eager/ember of the
medians and the per-round ratio median [p25, p75]. Comparing eager/ember across processes takes
eager as the yardstick (its own time moves between processes). docs/design/061.
"""
import argparse
import copy
import os
import statistics
import sys

TREE = (sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv
        else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TREE, "benchmarks"))
import _timing  # noqa: E402

_timing.prepare()
os.environ["EMBER_BACKEND_CACHE"] = "0"
os.environ.setdefault("EMBER_SPEED_CHECK", "0")

import torch  # noqa: E402

import ember  # noqa: E402
from ember.bench import suites  # noqa: E402,F401
from ember.bench.harness import Runner  # noqa: E402
from ember.bench.spec import REGISTRY  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models")
    ap.add_argument("--mode", default="train")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tree", default=TREE)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name in a.models.split(","):
        spec = REGISTRY[name]
        torch.manual_seed(0)
        m = spec.build()
        m.train(a.mode == "train")
        args, kw = spec.inputs(), spec.kwargs()
        e, c = copy.deepcopy(m), copy.deepcopy(m)
        runs = {"eager": Runner(e, e, a.mode, args, kw), "ember": Runner(ember.compile(c), c, a.mode, args, kw)}
        for r in runs.values():
            r.step(), r.step()
        s, _ = _timing.paired({k: r.step for k, r in runs.items()}, rounds=a.rounds, reps=1)
        st = _timing.ratio_stats(s["eager"], s["ember"])
        print(f"{os.path.basename(os.path.dirname(os.path.dirname(ember.__file__)))} {name} {a.mode} load {os.getloadavg()[0]:.1f} eager "
              f"{statistics.median(s['eager']) * 1e3:.1f} ms ember "
              f"{statistics.median(s['ember']) * 1e3:.1f} ms eager/ember {st['of_medians']:.3f} "
              f"per-round {st['median']:.3f} [{st['p25']:.3f}, {st['p75']:.3f}]", flush=True)


if __name__ == "__main__":
    main()
