"""Eager vs ember at inference on one broad-suite model, CPU time of this thread per call
(time.thread_time: the 2-core box is shared), alternating order, median ratio and per-round
range. For a before/after A/B run it alternately with PYTHONPATH on each tree:

    EMBER_SPEED_CHECK=0 PYTHONPATH=/path/to/base python benchmarks/infer_ab.py b_tv_swin_v2_t
    EMBER_SPEED_CHECK=0 PYTHONPATH=. python benchmarks/infer_ab.py b_tv_swin_v2_t
"""
import argparse
import copy
import os
import statistics as st
import time

import torch

import ember
from ember.bench import broad, suites  # noqa: F401 - registers the models
from ember.bench.spec import REGISTRY


def eval_model(name: str):
    """(model in eval mode, args, kwargs) of broad-suite model `name`, 1 intra-op thread."""
    torch.set_num_threads(1)
    spec = REGISTRY[name]
    torch.manual_seed(0)
    return spec.build().eval(), spec.inputs(), spec.kwargs()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--tag", default=os.environ.get("TAG", ""))
    a = ap.parse_args()
    m, args, kw = eval_model(a.model)
    eager, comp = copy.deepcopy(m), ember.compile(copy.deepcopy(m))

    def step(f):
        with torch.no_grad():
            return f(*args, **kw)
    want, got = step(eager), step(comp)
    want, got = (x if isinstance(x, torch.Tensor) else next(iter(x.values())) if
                 isinstance(x, dict) else x[0] for x in (want, got))
    report(step, eager, comp, a, ((got - want).abs().max() / want.abs().max()).item())


def report(step, eager, comp, a, err: float) -> None:
    """Time `step(eager)` and `step(comp)` in a.reps alternating rounds (thread CPU) and print
    the medians, the eager/ember ratio's median and range, `err` and the load."""
    step(eager), step(comp)
    times = {"eager": [], "ember": []}
    for r in range(a.reps):
        for name in ("eager", "ember") if r % 2 == 0 else ("ember", "eager"):
            t = time.thread_time()
            step(eager if name == "eager" else comp)
            times[name].append(time.thread_time() - t)
    rat = sorted(e / c for e, c in zip(times["eager"], times["ember"]))
    print("%s %s eager %.1f ember %.1f ms, eager/ember median %.3f [%.3f, %.3f], rel err %.1e, "
          "load %.1f" % (a.tag, a.model, st.median(times["eager"]) * 1e3,
                         st.median(times["ember"]) * 1e3, st.median(rat), rat[0], rat[-1], err,
                         os.getloadavg()[0]))


if __name__ == "__main__":
    main()
