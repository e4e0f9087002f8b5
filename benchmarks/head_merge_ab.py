"""Eager vs ember on a pointwise op over attention's head-merging view (levit's tail: a
[B*H, N, D] bmm output viewed [B, H, N, D], permuted to [B, N, H*D], hardswish), CPU time of
this thread per call, alternating order, median ratio and per-round range. Run it alternately
with PYTHONPATH on a base tree and on this one for a before/after (docs/design/047):

    EMBER_SPEED_CHECK=0 PYTHONPATH=/path/to/base python benchmarks/head_merge_ab.py CASE
"""
import sys
import os
import statistics as st
import time

import torch
import torch.nn.functional as F

import ember

CASES = {"levit_8x4x196x32": (8, 4, 196, 32), "levit_8x8x49x64": (8, 8, 49, 64),
         "levit_8x16x16x32": (8, 16, 16, 32)}


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:] or CASES:    # one case a process: the closures share one code
        b, h, n, d = CASES[name]          # object (a second case ran 20x slower, not looked at)
        def f(x):
            return F.hardswish(x.permute(0, 2, 1, 3).reshape(b, n, h * d))
        x = torch.randn(b, h, n, d)
        comp = ember.compile(f)
        torch.testing.assert_close(comp(x), f(x))
        inner = max(1, 2_000_000 // x.numel())
        times = {"eager": [], "ember": []}
        for r in range(15):
            for k in ("eager", "ember") if r % 2 == 0 else ("ember", "eager"):
                g = f if k == "eager" else comp
                t = time.thread_time()
                for _ in range(inner):
                    g(x)
                times[k].append((time.thread_time() - t) / inner)
        rat = sorted(e / c for e, c in zip(times["eager"], times["ember"]))
        print("%s %s eager %.1f ember %.1f us, eager/ember median %.2f [%.2f, %.2f], load %.1f"
              % (os.environ.get("TAG", ""), name, st.median(times["eager"]) * 1e6,
                 st.median(times["ember"]) * 1e6, st.median(rat), rat[0], rat[-1],
                 os.getloadavg()[0]))


if __name__ == "__main__":
    main()
