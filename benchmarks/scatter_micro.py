"""gather's backward (a scatter_add into zeros) at attention sizes, eager vs ember (docs/design/066).

Cases: `scatter`: zeros(x).scatter_add(-1, index, g), the backward's graph alone; `train`:
grad of gather(x * 1.5, -1, index) (forward and backward). Thread CPU time, one thread, eager and
ember paired and alternating in one process (benchmarks/_timing.paired), EMBER_SPEED_CHECK=0 so
ember's own kernels run. Prints medians and the per-round ratio's median [min-max].

    python benchmarks/scatter_micro.py --rounds 7 [--only REGEX]
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired, prepare, ratio_stats  # noqa: E402

# name: (x shape, index size along the last dim, index expanded from [L, K] over the batch)
SHAPES = {"bhlk_128": ((8, 12, 128, 128), 128, False),
          "bhlk_512x256": ((8, 12, 512, 256), 256, False),
          "deberta_c2p": ((96, 128, 512), 128, True)}


def main():
    prepare()
    os.environ["EMBER_SPEED_CHECK"] = "0"
    import torch
    import ember
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", default="")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name, (shape, k, expanded) in SHAPES.items():
        ishape = (*shape[:-1], k)
        if expanded:
            idx = torch.randint(0, shape[-1], ishape[-2:]).expand(ishape)
        else:
            idx = torch.randint(0, shape[-1], ishape)
        x = torch.randn(*shape, requires_grad=True)
        g = torch.randn(*ishape)

        def scatter(gr, i):
            return torch.zeros(shape).scatter_add(-1, i, gr)

        def fwd(t, i):
            return torch.gather(t * 1.5, -1, i)
        cases = {"scatter": (scatter, (g, idx), None),
                 "train": (fwd, (x, idx), g)}
        for case, (fn, args, grad) in cases.items():
            label = f"{name}/{case}"
            if a.only and not re.search(a.only, label):
                continue
            comp = ember.compile(fn, dynamic=False)   # each shape its own static graph
            if grad is None:
                run = {"eager": (lambda f=fn: f(*args)), "ember": (lambda f=comp: f(*args))}
            else:
                run = {k: (lambda f=f: torch.autograd.grad(f(*args), args[0], grad))
                       for k, f in (("eager", fn), ("ember", comp))}
            ref, got = run["eager"](), run["ember"]()
            same = all(torch.equal(r, o) for r, o in zip(
                ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)))
            samples, reps = paired(run, (), rounds=a.rounds)
            st = ratio_stats(samples["eager"], samples["ember"])
            med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in samples.items()}
            print(f"{label:28s} eager {med['eager']:8.3f} ms  ember {med['ember']:8.3f} ms  "
                  f"ember/eager {st['median']:.2f} [{st['min']:.2f}-{st['max']:.2f}]  "
                  f"bit-equal {same}  reps {reps}", flush=True)


if __name__ == "__main__":
    main()
