"""Batched GEMMs (attention scores / context where sdpa does not take them) on aten's bmm vs
oneDNN's linear called once per batch on the plain operands, `mkldnn._linear_pointwise(a[i],
w[i])` = a[i] @ w[i].T (torch exposes no float32 batched oneDNN matmul: aten's bmm reaches
oneDNN only for bf16/fp16 or a reduced-precision float32 setting), its B results stacked into
one tensor (the linear has no out= variant, so a route would pay that copy):

    scores   q[B,L,D] @ k[B,L,D].T   bmm(q, k.transpose(1, 2))   vs lp(q[i], k[i])
    context  p[B,L,L] @ v[B,L,D]     bmm(p, v)                   vs lp(p[i], v[i].t())

Paired alternating rounds (benchmarks/_timing.paired), thread CPU time, 1 thread, fp32; each
line: aten GFLOP/s, oneDNN GFLOP/s, the median [min, max] of per-round time ratios
aten/oneDNN (> 1: oneDNN faster).

    python benchmarks/gemm_bmm_micro.py --rounds 5 --shapes 12x512x64,12x197x64,16x128x64
"""
import argparse
import statistics

from _timing import paired, prepare


def forms(b, l, d, torch):
    lp = torch.ops.mkldnn._linear_pointwise
    q, k, v, p = (torch.randn(b, l, d), torch.randn(b, l, d), torch.randn(b, l, d),
                  torch.randn(b, l, l).softmax(-1))
    return {
        "scores": (lambda: torch.bmm(q, k.transpose(1, 2)),
                   lambda: torch.stack([lp(q[i], k[i], None, "none", [], "") for i in range(b)]),
                   2 * b * l * l * d),
        "context": (lambda: torch.bmm(p, v),
                    lambda: torch.stack([lp(p[i], v[i].t(), None, "none", [], "")
                                         for i in range(b)]),
                    2 * b * l * l * d),
    }


def main():
    prepare()
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="12x512x64,12x197x64,16x128x64", help="BxLxD,...")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("form B L D: aten GFLOP/s, oneDNN GFLOP/s, aten/oneDNN time ratio median [min, max]")
    for shape in a.shapes.split(","):
        b, l, d = map(int, shape.split("x"))
        for name, (ref, dnn, flop) in forms(b, l, d, torch).items():
            r0, r1 = ref(), dnn()
            err = ((r1 - r0).abs().max() / r0.abs().max()).item()
            assert err < 1e-5, (name, shape, err)
            times, _ = paired({"aten": ref, "onednn": dnn}, rounds=a.rounds, target_s=0.05)
            ga, gd = (flop / statistics.median(times[v]) / 1e9 for v in ("aten", "onednn"))
            rs = sorted(x / y for x, y in zip(times["aten"], times["onednn"]))
            print(f"{name:>8} {b:4d} {l:5d} {d:4d}: {ga:6.1f} {gd:6.1f}  "
                  f"x{statistics.median(rs):.3f} [{rs[0]:.3f}, {rs[-1]:.3f}]  rel.err {err:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
