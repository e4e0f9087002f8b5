"""GFLOP/s of the CPU GEMM libraries torch exposes, at transformer / convnet linear shapes:
aten addmm on nn.Linear's [N, K] weight (MKL sgemm, packs the weight each call), MKL's packed
GEMM (`mkl._mkl_linear` on a `mkl._mkl_reorder_linear_weight` pack), oneDNN's linear
(`mkldnn._linear_pointwise` on a `mkldnn._reorder_linear_weight` pack, and on the plain
weight). Paired alternating rounds (benchmarks/_timing.paired), thread CPU time, 1 thread.
Chooses backends/prepack.py's GEMM library (docs/design/071).

    python benchmarks/gemm_libs.py --rounds 7 --shapes 8x768x3072,1500x384x1536
"""
import argparse
import statistics

from _timing import paired, prepare

SHAPES = ("8x768x768,8x768x3072,8x3072x768,197x768x768,197x768x3072,197x3072x768,"
          "788x768x3072,1024x768x768,1500x384x384,1500x384x1536,1500x1536x384,"
          "3136x96x384,3136x384x96,6272x96x384,12544x96x384,784x192x768,784x768x192,"
          "1024x4096x1024,256x1024x4096,256x4096x1024")


def main():
    prepare()
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", default=SHAPES, help="MxKxN,...")
    ap.add_argument("--variants", default="addmm,mkl,onednn,onednn_plain")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("GFLOP/s, thread CPU time, 1 thread: median [min, max] over rounds; ratio vs addmm "
          "median of per-round ratios")
    for shape in a.shapes.split(","):
        m, k, n = map(int, shape.split("x"))
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        pk = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        pd = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns = {"addmm": lambda: torch.addmm(b, x, w.t()),
               "mkl": lambda: torch.ops.mkl._mkl_linear(x, pk, w, b, m),
               "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, pd, b, "none", [], ""),
               "onednn_plain": lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [],
                                                                           "")}
        fns = {v: fns[v] for v in a.variants.split(",")}
        ref = fns["addmm"]()
        for name, fn in fns.items():
            err = (fn() - ref).abs().max().item()
            assert err < 1e-3 * k ** 0.5, (name, err)
        times, _ = paired(fns, rounds=a.rounds, target_s=0.1)
        flop = 2 * m * k * n
        row = []
        for name, t in times.items():
            g = [flop / s / 1e9 for s in t]
            r = [ta / s for ta, s in zip(times["addmm"], t)]
            row.append(f"{name} {statistics.median(g):5.1f} [{min(g):5.1f},{max(g):5.1f}]"
                       + ("" if name == "addmm" else f" x{statistics.median(r):.2f}"))
        print(f"{shape:>16}: " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
