"""oneDNN's channels-last conv vs its blocked NCHW one, and the layout rule built on it
(docs/design/079, `ember/backends/layout.py:l1_aliased`). Thread CPU time, 1 thread,
alternating rounds, medians and the range of the per-round ratios.

    # per conv: C_in,width,C_out,k[,stride[,dilation]] (batch 1, height = width)
    PYTHONPATH=. python benchmarks/conv_alias.py 1024,28,512,3 960,28,512,3 1024,56,256,3,2

A model before/after: benchmarks/infer_ab.py, alternately on each tree.
"""
import argparse
import statistics as st
import time

import torch
import torch.nn.functional as F

CP = torch.ops.mkldnn._convolution_pointwise.default
REORDER = torch.ops.mkldnn._reorder_convolution_weight.default


def cpu_time(f, n=1):
    t = time.thread_time()
    for _ in range(n):
        f()
    return (time.thread_time() - t) / n


def rounds(fs: dict, reps: int, n=1) -> dict:
    """{name: [seconds per call, one per round]}, the order alternating each round."""
    times = {k: [] for k in fs}
    for r in range(reps):
        for k in (list(fs) if r % 2 == 0 else list(fs)[::-1]):
            times[k].append(cpu_time(fs[k], n))
    return times


def spread(a, b) -> str:
    rat = sorted(x / y for x, y in zip(a, b))
    return f"{st.median(rat):.2f}x [{rat[0]:.2f}-{rat[-1]:.2f}]"


def conv_case(spec: str, reps: int) -> None:
    ci, w_, co, k, s, d = (list(map(int, spec.split(","))) + [1, 1])[:6]
    p = d * (k // 2)
    x, w, b = torch.randn(1, ci, w_, w_), torch.randn(co, ci, k, k) * 0.01, torch.randn(co)
    xcl = x.contiguous(memory_format=torch.channels_last)
    wp = REORDER(w, [p, p], [s, s], [d, d], 1, list(x.shape))
    flops = 2 * ci * co * k * k * ((w_ + 2 * p - d * (k - 1) - 1) // s + 1) ** 2
    fs = {"nchw": lambda: F.conv2d(x, w, b, s, p, d),
          "cl_packed": lambda: CP(xcl, wp, b, [p, p], [s, s], [d, d], 1, "none", [], "")}
    torch.testing.assert_close(fs["cl_packed"](), fs["nchw"](), atol=1e-3, rtol=1e-3)
    t = rounds(fs, reps, max(1, int(5e8 / flops)))
    print(f"C_in {ci:5d} width {w_:3d} C_out {co:5d} k {k} s {s} d {d}: NCHW "
          f"{flops / st.median(t['nchw']) / 1e9:6.1f} GFLOP/s, channels-last packed "
          f"{flops / st.median(t['cl_packed']) / 1e9:6.1f}, channels-last/NCHW speed "
          f"{spread(t['nchw'], t['cl_packed'])}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("convs", nargs="*")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with torch.no_grad():
        for c in a.convs:
            conv_case(c, a.reps)


if __name__ == "__main__":
    main()
