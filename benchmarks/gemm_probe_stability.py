"""How often gemmlib's probe verdict flips: N probes in one process, quiet and under a competing
load (LOAD processes each looping a one-thread 1024^3 matmul, competing for the cores, the L3 and
memory bandwidth). Prints each probe's verdict and ratios, then the verdict counts per condition.

    PYTHONPATH=<tree> python benchmarks/gemm_probe_stability.py --probes 10 --load 2

Run against either tree (it calls `ember.backends.gemmlib.probe()`); threads 1 (the probe's clock
is thread CPU time only then). docs/design/083."""
import argparse
import collections
import os
import time

import torch

import _timing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--load", type=int, default=2, help="competing processes (0: quiet only)")
    ap.add_argument("--conditions", default="quiet,load")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from ember.backends import gemmlib
    verdicts = {}
    for cond in args.conditions.split(","):
        got = []
        with _timing.competing_load(args.load if cond == "load" else 0):
            for i in range(args.probes):
                t0, c0 = time.perf_counter(), time.thread_time()
                ch = gemmlib.probe()
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                got.append((ch.library, ch.plain))
                print(f"{cond} {i}: load1 {os.getloadavg()[0]:.1f} library {ch.library} plain "
                      f"{ch.plain} wall {wall:.2f}s cpu {cpu:.2f}s | {ch.why}", flush=True)
        verdicts[cond] = collections.Counter(got)
    for cond, c in verdicts.items():
        print(f"{cond}: " + ", ".join(f"library {lib} plain {pl}: {n}" for (lib, pl), n in
                                      sorted(c.items(), key=str)))


if __name__ == "__main__":
    main()
