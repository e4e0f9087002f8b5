"""Training steps of eager, ember with two sets of options [, torch.compile] on one bench model,
paired in one process (bench Runner: forward, loss, backward, SGD): thread CPU time per step,
1 thread, the runners in alternating order; medians, the per-round ratios' median and range,
the load. For an A/B of a change an option turns off (docs/design/076: gemm="mkl" keeps every
unfrozen GEMM on aten):

    EMBER_SPEED_CHECK=0 PYTHONPATH=. python benchmarks/train_options_ab.py b_hf_bert \
        --base '{"gemm": "mkl"}' --rounds 7 [--torch]

For a change a module constant turns off, `--base-patch MODULE:NAME=VALUE` sets it (a Python
literal) while the base compiles (its two warm-up steps), e.g. without the plain-weight clause
of docs/design/081: --base-patch 'ember.backends.prepack:PLAIN_MIN_WEIGHT=1<<60'.
"""
import argparse
import contextlib
import copy
import importlib
import json
import os
import statistics as st
import time

from _timing import prepare


def main():
    prepare()
    import torch
    import ember
    from ember.bench import suites  # noqa: F401 - registers the models
    from ember.bench.harness import Runner
    from ember.bench.spec import REGISTRY
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--base", default="{}", help="options of the base ember (JSON)")
    ap.add_argument("--new", default="{}", help="options of the new ember (JSON)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--torch", action="store_true", help="also torch.compile")
    ap.add_argument("--base-patch", default=None, help="MODULE:NAME=VALUE while the base compiles")
    a = ap.parse_args()
    if a.base_patch:    # the caches' keys do not see a patched constant: with equal options
        # the new ember would reuse the base's captured frames (in process) or load its graphs
        # (backend cache); options that differ, and the backend cache off
        os.environ["EMBER_BACKEND_CACHE"] = "0"
        a.base = json.dumps({**json.loads(a.base), "backend_cache": False})
    torch.set_num_threads(1)
    spec = REGISTRY[a.model]
    torch.manual_seed(0)
    m = spec.build()
    m.train(True)
    args, kw = spec.inputs(), spec.kwargs()
    runners = {}
    for name, make in (("eager", lambda mod: mod),
                       ("base", lambda mod: ember.compile(mod, options=json.loads(a.base))),
                       ("new", lambda mod: ember.compile(mod, options=json.loads(a.new))),
                       ("torch", torch.compile)):
        if name == "torch" and not a.torch:
            continue
        mod = copy.deepcopy(m)
        with patched(a.base_patch if name == "base" else None):
            runners[name] = Runner(make(mod), mod, "train", args, kw)
            for _ in range(2):
                runners[name].step()
    cpu = {k: [] for k in runners}
    order = list(runners)
    for i in range(a.rounds):
        for k in (order if i % 2 == 0 else order[::-1]):
            t = time.thread_time()
            runners[k].step()
            cpu[k].append(time.thread_time() - t)
    print(f"{a.model} train, load {os.getloadavg()[0]:.1f}, {a.rounds} rounds, base {a.base}, "
          f"new {a.new}; thread CPU ms per step (median):",
          {k: round(st.median(v) * 1e3, 1) for k, v in cpu.items()})
    for x, y in [("eager", k) for k in runners if k != "eager"] + [("base", "new")]:
        r = sorted(p / q for p, q in zip(cpu[x], cpu[y]))
        print(f"  {x}/{y} median {st.median(r):.3f} [min {r[0]:.3f}, max {r[-1]:.3f}]")


@contextlib.contextmanager
def patched(spec):
    if spec is None:
        yield
        return
    where, value = spec.split("=", 1)
    module, name = where.split(":")
    mod = importlib.import_module(module)
    old = getattr(mod, name)
    setattr(mod, name, eval(value))     # noqa: S307 - a benchmark's own command line
    try:
        yield
    finally:
        setattr(mod, name, old)


if __name__ == "__main__":
    main()
