"""A/B of ember compile options (layout, freezing) on broad-suite models, in one process.

Each variant is the model compiled with `ember.compile(model, options=...)` (or torch.compile);
all variants and eager run in paired alternating rounds (A B C, C B A, ...) timed with
`time.thread_time` (CPU time of this thread: at 1 thread, what the call costs, and less moved by
other load than wall time). Prints, per model, the median time and the ratio of medians vs eager
with the per-round range, and the geomean of each variant over the models.

    python benchmarks/layout_ab.py --models 'shufflenet|densenet121' --mode infer \\
        --variants auto,nchw,inductor --rounds 7

Variants: auto (the default rules), nchw (options layout=contiguous), cl (layout=channels_last),
frozen (freeze=True), inductor (torch.compile). Training (`--mode train`): one forward+backward
step of sum(output), no optimizer.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402

_timing.prepare()

import torch  # noqa: E402

import ember  # noqa: E402
from ember.bench import suites  # noqa: E402

VARIANTS = {"auto": {}, "nchw": {"layout": "contiguous"}, "cl": {"layout": "channels_last"},
            "frozen": {"freeze": True}}


def _step(fn, mode):
    def infer(args, kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)

    def train(args, kwargs):
        out = fn(*args, **kwargs)
        out = out if isinstance(out, torch.Tensor) else next(iter(out.values()))
        out.float().sum().backward()
        return out
    return infer if mode == "infer" else train


def run_model(name, variants, mode, rounds):
    spec = suites.select("broad", "^" + name + "$")[0]
    model, args, kwargs = suites.instantiate(spec)
    model.train(mode == "train")
    if mode == "infer":
        model.requires_grad_(True)          # the bench's default: not frozen unless asked
    fns = {"eager": _step(model, mode)}
    for v in variants:
        m = copy.deepcopy(model)
        fns[v] = _step(torch.compile(m) if v == "inductor" else
                       ember.compile(m, options=VARIANTS[v]), mode)
    for f in fns.values():
        for _ in range(2):
            f(args, kwargs)
    samples = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            t = time.thread_time()
            fns[k](args, kwargs)
            samples[k].append(time.thread_time() - t)
    out = {}
    for k, v in samples.items():
        r = _timing.ratio_stats(samples["eager"], v)
        out[k] = r["of_medians"]
        print(f"  {name:32s} {k:9s} median {statistics.median(v) * 1e3:8.1f} ms  vs eager "
              f"{r['of_medians']:.3f} [{r['min']:.3f}, {r['max']:.3f}]", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, help="regex on broad-suite model names")
    ap.add_argument("--mode", default="infer", choices=("infer", "train"))
    ap.add_argument("--variants", default="auto,nchw")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    os.environ["EMBER_SPEED_CHECK"] = "0"
    torch.set_num_threads(a.threads)
    names = [s.name for s in suites.select("broad", ".*") if re.search(a.models, s.name)]
    variants = a.variants.split(",")
    print(f"{a.mode}, {a.threads} thread(s), {a.rounds} rounds, CPU time; load average "
          f"{os.getloadavg()[0]:.1f}; models: {' '.join(names)}", flush=True)
    ratios = {v: [] for v in ["eager", *variants]}
    for name in names:
        try:
            got = run_model(name, variants, a.mode, a.rounds)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next model
            print(f"  {name}: failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        for k, r in got.items():
            ratios[k].append(r)
    for k, rs in ratios.items():
        if rs:
            print(f"geomean {k:9s} {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} "
                  f"over {len(rs)} models")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
