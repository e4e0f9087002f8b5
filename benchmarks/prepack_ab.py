"""Paired A/B of linear prepacking on broad-suite models at inference (frozen, no_grad):
eager, ember with old prepack limits (`--old`: MKL packing only up to 8 rows, say),
ember as is; CPU time of this thread per call (time.thread_time: the 2-core box is shared),
alternating order, medians and per-round ratio ranges. docs/design/041.

    PYTHONPATH=. python benchmarks/prepack_ab.py --models 'b_hf_vit$|b_hf_bert$' --rounds 7
"""
import argparse
import itertools
import copy
import os
import re
import statistics as st
import time

import torch


_SERIAL = itertools.count()


def _wrapped(model, tag):
    """`model` inside a module class of its own, from a file name of its own: ember caches
    compiled graphs per code location, and two instances of one class would share (and
    refold) one frozen graph; many would hit the recompile limit."""
    ns = {}
    src = (f"class Wrap(torch.nn.Module):\n"
           "    def __init__(self, m):\n        super().__init__()\n        self.m = m\n"
           "    def forward(self, *a, **k):\n        return self.m(*a, **k)\n")
    exec(compile(src, f"<prepack_ab {tag} {next(_SERIAL)}>", "exec"), {"torch": torch}, ns)  # noqa: S102
    return ns["Wrap"](model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--old", default="MAX_ROWS=8",
                    help="comma list of prepack.NAME=INT for the old variant (before 041: "
                         "MAX_ROWS=8,PATCH_MIN_K=1000000000)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import ember
    from ember.backends import prepack
    from ember.bench import suites  # noqa: F401 - registers the suites
    from ember.bench.spec import REGISTRY
    old = {k: int(v) for k, v in (kv.split("=") for kv in a.old.split(","))}
    new = {k: getattr(prepack, k) for k in old}
    for name in [n for n in REGISTRY if re.search(a.models, n)]:
        spec = REGISTRY[name]
        torch.manual_seed(0)
        model = spec.build().eval()
        args, kw = spec.inputs(), spec.kwargs()
        eager = copy.deepcopy(model)
        variants = {"eager": eager}
        packs = {}
        for label, values in (("old", old), ("new", new)):
            for k, v in values.items():
                setattr(prepack, k, v)
            before = ember.stats()["counts"].get("prepacked_linears", 0)
            m = ember.compile(_wrapped(copy.deepcopy(model), label))
            with torch.no_grad():
                m(*args, **kw)
                m(*args, **kw)
            variants[label] = m
            packs[label] = ember.stats()["counts"].get("prepacked_linears", 0) - before
        ts = {k: [] for k in variants}
        for r in range(a.rounds):
            order = list(variants.items())
            for k, f in (order if r % 2 == 0 else order[::-1]):
                with torch.no_grad():
                    t = time.thread_time()
                    f(*args, **kw)
                    ts[k].append(time.thread_time() - t)
        med = {k: st.median(v) for k, v in ts.items()}
        line = [f"{name}: eager {med['eager']*1e3:.1f} ms"]
        for k in ("old", "new"):
            rat = [e / x for e, x in zip(ts["eager"], ts[k])]
            line.append(f"{k} {med[k]*1e3:.1f} ms ({packs[k]} packed) {med['eager']/med[k]:.3f}x "
                        f"[{min(rat):.2f}, {max(rat):.2f}]")
        rat = [o / n for o, n in zip(ts["old"], ts["new"])]
        line.append(f"new/old {med['old']/med['new']:.3f}x [{min(rat):.2f}, {max(rat):.2f}]")
        print("; ".join(line), "| load", os.getloadavg()[0], flush=True)


if __name__ == "__main__":
    main()
