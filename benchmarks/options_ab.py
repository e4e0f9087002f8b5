"""Eager vs ember with two sets of options on one broad-suite model at inference, paired in one
process: thread CPU time per call (1 thread), the three alternating in rotating order; medians,
the per-round ratios' median and range, the load. For an A/B of a rewrite that an option turns
off (docs/design/069: attention="as_written" keeps the modules' fast-path ops):

    EMBER_SPEED_CHECK=0 PYTHONPATH=. python benchmarks/options_ab.py b_tv_vit_b_16 \
        --base '{"attention": "as_written"}' --reps 9
"""
import argparse
import copy
import json
import os
import statistics as st
import time

import torch

import ember
from infer_ab import eval_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--base", default="{}", help="options of the base ember (JSON)")
    ap.add_argument("--new", default="{}", help="options of the new ember (JSON)")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    m, args, kw = eval_model(a.model)
    fns = {"eager": copy.deepcopy(m),
           "base": ember.compile(copy.deepcopy(m), options=json.loads(a.base)),
           "new": ember.compile(copy.deepcopy(m), options=json.loads(a.new))}

    def step(f):
        with torch.no_grad():
            return f(*args, **kw)
    outs = {k: step(f) for k, f in fns.items()}
    first = {k: o if isinstance(o, torch.Tensor) else next(iter(o.values())) if
             isinstance(o, dict) else o[0] for k, o in outs.items()}
    err = {k: ((first[k] - first["eager"]).abs().max() / first["eager"].abs().max()).item()
           for k in ("base", "new")}
    for f in fns.values():
        step(f)
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(a.reps):
        for k in order[r % 3:] + order[:r % 3]:
            t = time.thread_time()
            step(fns[k])
            times[k].append(time.thread_time() - t)
    med = {k: st.median(v) * 1e3 for k, v in times.items()}

    def ratio(x, y):
        rat = sorted(p / q for p, q in zip(times[x], times[y]))
        return "%.3f [%.3f, %.3f]" % (st.median(rat), rat[0], rat[-1])
    print("%s: eager %.1f base %.1f new %.1f ms; eager/base %s, eager/new %s, base/new %s; "
          "rel err base %.1e new %.1e; load %.1f" % (
              a.model, med["eager"], med["base"], med["new"], ratio("eager", "base"),
              ratio("eager", "new"), ratio("base", "new"), err["base"], err["new"],
              os.getloadavg()[0]))


if __name__ == "__main__":
    main()
