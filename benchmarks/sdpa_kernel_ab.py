"""CPU inference attention: ember's fused kernel (torch.ops.ember.sdpa_infer, codegen/sdpa_cpp.py)
against eager's F.scaled_dot_product_attention (ATen's flash kernel), the measurements behind the
shape rule `ember.backends.sdpa_kernel.kernel_wins` (docs/design/085-small-attention-kernel.md).

Per shape B x H x Lq x Lk x D (q, k, v made as [B, L, H, D] and transposed, as a transformer's
heads are), with a mask: none, "bias" (a dense float [B, H, Lq, Lk], as swin's relative-position
bias plus shift mask), "causal" (an additive -inf upper triangle [B, 1, Lq, Lk]), "pad" (an
additive [B, 1, 1, Lk] padding mask), "boolcausal" (a bool [B, 1, Lq, Lk] lower triangle, as
transformers 5 gives its decoders), "mincausal" (finfo.min above the diagonal, as transformers 4),
"window" (bool causal sliding window of Lk / 2 keys, as mistral's) or "is_causal" (no mask,
is_causal=True). fp32, no grad,
one thread by default. Timing: paired alternating rounds (benchmarks/_timing.py, thread CPU
time), "x" = flash's time over the kernel's (median of per-round ratios [min, max]); GF/s counts
4·B·H·Lq·Lk·D.

    python benchmarks/sdpa_kernel_ab.py [--rounds 7] [--threads 1]
        [--shapes 256x3x49x49x32:bias,...]
        [--json out.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired, prepare, ratio_stats  # noqa: E402

DEFAULT = ("256x3x49x49x32:bias,64x6x49x49x32:bias,4x6x197x197x64,4x12x197x197x64,"
           "8x8x77x77x64:causal,8x12x50x50x64,4x8x128x128x64:pad,4x8x64x128x64:pad,"
           "2x8x256x256x64:causal,2x8x256x256x64:is_causal,8x12x256x256x64:is_causal,"
           "2x8x512x512x64,1x6x1500x1500x64,1x6x64x1500x64,"
           "2x8x32x256x64:causal,2x8x48x256x64,2x8x1024x1024x64,1x8x3000x3000x64,1x8x4096x4096x64,"
           "2x8x256x256x16,2x4x256x256x128,1x2x64x64x32,1x4x96x96x64")


def inputs(spec: str):
    import torch
    dims, _, mask = spec.partition(":")
    B, H, LQ, LK, D = map(int, dims.split("x"))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, H, D, generator=g).transpose(1, 2) for n in (LQ, LK, LK))
    m = None
    if mask == "bias":
        m = torch.randn(B, H, LQ, LK, generator=g)
    elif mask == "causal":
        m = torch.full((LQ, LK), float("-inf")).triu(1).expand(B, 1, LQ, LK).contiguous()
    elif mask in ("boolcausal", "window"):
        m = torch.ones(LQ, LK, dtype=torch.bool).tril()
        if mask == "window":
            m &= torch.ones(LQ, LK, dtype=torch.bool).triu(-(LK // 2) + 1)
        m = m.expand(B, 1, LQ, LK).contiguous()
    elif mask == "mincausal":
        m = torch.full((LQ, LK), torch.finfo(torch.float32).min).triu(1)
        m = m.expand(B, 1, LQ, LK).contiguous()
    elif mask == "pad":
        m = torch.zeros(B, 1, 1, LK)
        m[0, ..., -LK // 8:] = float("-inf")
    return (q, k, v, m, D ** -0.5, mask == "is_causal"), 4 * B * H * LQ * LK * D


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=DEFAULT)
    ap.add_argument("--json")
    a = ap.parse_args()
    prepare()
    import torch
    import torch.nn.functional as F
    from ember.backends import sdpa_kernel
    torch.set_num_threads(a.threads)

    def flash(q, k, v, m, s, causal):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=s, is_causal=causal)
    ours = torch.ops.ember.sdpa_infer
    rows = []
    with torch.no_grad():
        for spec in a.shapes.split(","):
            args, flops = inputs(spec)
            ref, got = flash(*args), ours(*args)
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            t, _ = paired({"flash": flash, "ember": ours}, args, a.rounds)
            r = ratio_stats(t["flash"], t["ember"])
            B, H, LQ, LK, D = map(int, spec.partition(":")[0].split("x"))
            row = {"shape": spec, "flash_gflops": flops / statistics.median(t["flash"]) / 1e9,
                   "ember_gflops": flops / statistics.median(t["ember"]) / 1e9, "x": r["median"],
                   "min": r["min"], "max": r["max"], "max_rel_err": err,
                   "rule": sdpa_kernel.kernel_wins(B * H, LQ, LK, D, D)}
            rows.append(row)
            print(f"{spec:>22}  flash {row['flash_gflops']:5.1f} GF/s  ember "
                  f"{row['ember_gflops']:5.1f} GF/s  x {r['median']:.2f} [{r['min']:.2f}, "
                  f"{r['max']:.2f}]  err {err:.1e}  rule {'kernel' if row['rule'] else 'flash'}",
                  flush=True)
    if a.json:
        with open(a.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
