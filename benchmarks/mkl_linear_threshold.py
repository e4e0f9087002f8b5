"""Time y = x @ W^T + b on CPU: aten addmm (weight stored [N, K] as nn.Linear's, and [K, N] as
GPT-2's Conv1D) vs MKL's packed-weight `mkl._mkl_linear` (weight
packed once with `mkl._mkl_reorder_linear_weight`), over M and a few (K, N), to choose
freeze.py's prepacking threshold (docs/design/024). Paired, alternating, medians.

    python benchmarks/mkl_linear_threshold.py --threads 1 --rounds 9
"""
import argparse
import statistics
import time

import torch


def bench(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ms", default="1,2,4,8,16,32,64")
    ap.add_argument("--shapes", default="768x768,768x3072,3072x768,512x1376,2048x8192")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"threads {a.threads}, rounds {a.rounds}; us per call: median (min) over rounds; "
          "ratio linear/packed: median [min, max] of per-round ratios")
    for shape in a.shapes.split(","):
        k, n = map(int, shape.split("x"))
        w, b = torch.randn(n, k), torch.randn(n)
        wt = w.t().contiguous()
        for m in map(int, a.ms.split(",")):
            x = torch.randn(m, k)
            p = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
            calls = max(3, int(2e8 / (m * k * n * 2 + 1e6)))
            fns = {"linear": lambda: torch.addmm(b, x, w.t()),      # nn.Linear: [N, K] weight
                   "conv1d": lambda: torch.addmm(b, x, wt),         # GPT-2 Conv1D: [K, N]
                   "packed": lambda: torch.ops.mkl._mkl_linear(x, p, w, b, m)}
            times = {name: [] for name in fns}
            for _ in range(a.rounds + 1):                    # the first round warms up
                for name, fn in fns.items():
                    times[name].append(bench(fn, calls))
            t = {name: v[1:] for name, v in times.items()}
            r = [lin / pk for lin, pk in zip(t["linear"], t["packed"])]
            print(f"K={k:5d} N={n:5d} M={m:3d}: " + "  ".join(
                f"{name} {statistics.median(v):8.1f} (min {min(v):8.1f})" for name, v in t.items())
                + f"  linear/packed {statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]",
                flush=True)


if __name__ == "__main__":
    main()
