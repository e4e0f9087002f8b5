"""conv1d: ATen on [N, C, L] vs oneDNN's fused op as a one-row channels-last conv2d (prepacked
weight), the layout rule of backends/layout.py for conv1d (docs/design/088). Thread CPU time,
1 thread, alternating rounds, medians and the range of the per-round ratios; also the cost of
converting the input [N, C, L] -> channels-last ([N, L, C] memory).

    # per conv: N,C_in,L,C_out,k[,stride[,groups[,padding[,dilation]]]]
    PYTHONPATH=. python benchmarks/conv1d_layout.py 2,1,16000,512,10,5 2,512,3199,512,3,2
"""
import argparse
import statistics as st

import torch
import torch.nn.functional as F

from conv_alias import CP, REORDER, rounds, spread


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("convs", nargs="+")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("conv (N,Cin,L,Cout,k,s,g,p,d)        aten NCL ms  CL 1-row ms  NCL/CL  convert ms")
    for spec in a.convs:
        v = [int(t) for t in spec.split(",")]
        n, ci, length, co, k = v[:5]
        s, g, p, d = (v[5:] + [1, 1, 0, 1][len(v) - 5:])[:4]
        x = torch.randn(n, ci, length)
        w, b = torch.randn(co, ci // g, k), torch.randn(co)
        x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        w4 = w.unsqueeze(2)
        pk = REORDER(w4, [0, p], [1, s], [1, d], g, list(x4.shape))
        fs = {"aten": lambda: F.conv1d(x, w, b, s, p, d, g),
              "cl": lambda: CP(x4, pk, b, [0, p], [1, s], [1, d], g, "none", [], ""),
              "conv": lambda: x.unsqueeze(2).contiguous(memory_format=torch.channels_last)}
        torch.testing.assert_close(fs["cl"]().squeeze(2), fs["aten"](), atol=1e-3, rtol=1e-3)
        t = rounds(fs, a.reps, 3)
        med = {kk: st.median(vv) * 1e3 for kk, vv in t.items()}
        print(f"{spec:38s} {med['aten']:10.3f} {med['cl']:12.3f}  "
              f"{spread(t['aten'], t['cl']):18s} {med['conv']:8.3f}")


if __name__ == "__main__":
    main()
