"""resnet50's 1x1 residual convs: conv + a separate add-relu pass, against oneDNN's fused binary
post-op, out of place (`_convolution_pointwise.binary`, what ember uses) and in place
(`_convolution_pointwise_.binary`, writes into `other`). Channels-last, 1 thread, medians of
alternating calls timed with `time.thread_time` (docs/design/024: FUSE_ADD_MAX_REDUCTION).

    python benchmarks/conv_residual_add.py --batches 2,4,8,16 --reps 61
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402

_timing.prepare()

import torch  # noqa: E402

CL = torch.channels_last
CONV = torch.ops.mkldnn._convolution_pointwise
#: (input channels, spatial size, output channels) of resnet50's bottleneck conv3 per stage
STAGES = [(64, 56, 256), (128, 28, 512), (256, 14, 1024), (512, 7, 2048)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8")
    ap.add_argument("--reps", type=int, default=61)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"load average {os.getloadavg()[0]:.1f}; ms, medians of {args.reps}")
    with torch.no_grad():
        for batch in map(int, args.batches.split(",")):
            for cin, hw, cout in STAGES:
                x = torch.randn(batch, cin, hw, hw).contiguous(memory_format=CL)
                w = torch.randn(cout, cin, 1, 1)
                b = torch.randn(cout)
                other = torch.randn(batch, cout, hw, hw).contiguous(memory_format=CL)
                dst = other.clone()
                conv = ([0, 0], [1, 1], [1, 1], 1)
                fns = {
                    "separate": lambda: torch.ops.aten._add_relu.Tensor(
                        CONV(x, w, b, *conv, "none", [], ""), other),
                    "fused": lambda: CONV.binary(x, other, w, b, *conv, "add", 1.0, "relu",
                                                 [], None),
                    "fused_inplace": lambda: torch.ops.mkldnn._convolution_pointwise_.binary(
                        dst, x, w, b, *conv, "add", 1.0, "relu", [], None),
                }
                torch.testing.assert_close(fns["fused"](), fns["separate"](), atol=1e-4,
                                           rtol=1e-4)
                times = collections.defaultdict(list)
                order = list(fns)
                for r in range(args.reps):
                    for k in (order if r % 2 == 0 else order[::-1]):
                        if k == "fused_inplace":
                            dst.copy_(other)
                        t = time.thread_time()
                        fns[k]()
                        times[k].append(time.thread_time() - t)
                meds = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                print(f"batch {batch:2d} {cin:4d}x{hw}x{hw} -> {cout:4d} (K={cin:3d}): " +
                      "  ".join(f"{k} {v:6.2f}" for k, v in meds.items()))


if __name__ == "__main__":
    main()
