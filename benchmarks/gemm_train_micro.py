"""Training-GEMM forms on aten (MKL sgemm) vs oneDNN's linear on the plain (unpacked, strided)
weight, `mkldnn._linear_pointwise(a, w, bias, "none", [], "")` = a @ w.T (+ bias): the three
GEMMs of a linear's step, as ember's lowering calls them (lower/rules_data.py, design 076):

    fwd   x[M,K] @ W[N,K].T (+ b)  addmm(b, x, W.t())   vs lp(x, W, b)
    gin   g[M,N] @ W[N,K]          mm(g, W)             vs lp(g, W.t())       (strided weight)
    gw    g[M,N].T @ x[M,K]        mm(g.t(), x)         vs lp(g.t(), x.t())   (strided both)
    gw_copy                                              vs lp(g.t().contiguous(), x.t())
    gw_pre  gt[N,M] @ x[M,K], gt stored   mm(gt, x)     vs lp(gt, x.t())
    gw_swap                                              vs lp(x.t(), g.t()).t()   (copies x)
    gw_swap_c                                            vs the same, made row-major

Paired alternating rounds (benchmarks/_timing.paired), thread CPU time, 1 thread, fp32;
each line: aten GFLOP/s, oneDNN GFLOP/s, and the median [min, max] of the per-round time
ratios aten/oneDNN (> 1: oneDNN faster).

    python benchmarks/gemm_train_micro.py --rounds 5 --rows 128,512,1024,4096
"""
import argparse
import statistics

from _timing import paired, prepare

WIDTHS = "384x384,768x768,768x3072,3072x768,1024x1024"


def forms(m, k, n, torch):
    lp = torch.ops.mkldnn._linear_pointwise
    x, w, b, g = torch.randn(m, k), torch.randn(n, k), torch.randn(n), torch.randn(m, n)
    gt = g.t().contiguous()
    return {
        "fwd": (lambda: torch.addmm(b, x, w.t()), lambda: lp(x, w, b, "none", [], "")),
        "fwd_nobias": (lambda: torch.mm(x, w.t()), lambda: lp(x, w, None, "none", [], "")),
        "gin": (lambda: torch.mm(g, w), lambda: lp(g, w.t(), None, "none", [], "")),
        "gw": (lambda: torch.mm(g.t(), x), lambda: lp(g.t(), x.t(), None, "none", [], "")),
        # the same with the transposed input copied first: is gw's cost oneDNN's own copy?
        "gw_copy": (lambda: torch.mm(g.t(), x),
                    lambda: lp(g.t().contiguous(), x.t(), None, "none", [], "")),
        # and with it stored transposed beforehand (a kernel of ours writing it that way)
        "gw_pre": (lambda: torch.mm(gt, x), lambda: lp(gt, x.t(), None, "none", [], "")),
        # the transposed product (x.t() @ g).t(): oneDNN copies x instead of g, and the [K, N]
        # result is transposed back (a strided view; _t copies it to row-major)
        "gw_swap": (lambda: torch.mm(g.t(), x), lambda: lp(x.t(), g.t(), None, "none", [], "").t()),
        "gw_swap_c": (lambda: torch.mm(g.t(), x),
                      lambda: lp(x.t(), g.t(), None, "none", [], "").t().contiguous()),
    }


def main():
    prepare()
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="128,512,1024,4096")
    ap.add_argument("--widths", default=WIDTHS, help="KxN,...")
    ap.add_argument("--forms", default="fwd,gin,gw")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("form M K N: aten GFLOP/s, oneDNN GFLOP/s, aten/oneDNN time ratio median [min, max]")
    for m in map(int, a.rows.split(",")):
        for kn in a.widths.split(","):
            k, n = map(int, kn.split("x"))
            fs = forms(m, k, n, torch)
            for name in a.forms.split(","):
                ref, dnn = fs[name]
                r0, r1 = ref(), dnn()
                err = ((r1 - r0).abs().max() / r0.abs().max()).item()
                assert err < 1e-5, (name, m, k, n, err)
                times, _ = paired({"aten": ref, "onednn": dnn}, rounds=a.rounds, target_s=0.05)
                flop = 2 * m * k * n
                ga, gd = (flop / statistics.median(times[v]) / 1e9 for v in ("aten", "onednn"))
                rs = sorted(x / y for x, y in zip(times["aten"], times["onednn"]))
                print(f"{name:>10} {m:5d} {k:5d} {n:5d}: {ga:6.1f} {gd:6.1f}  "
                      f"x{statistics.median(rs):.3f} [{rs[0]:.3f}, {rs[-1]:.3f}]  "
                      f"rel.err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
