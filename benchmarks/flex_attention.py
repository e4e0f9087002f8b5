"""flex_attention on CPU: eager vs ember vs torch.compile, forward and forward+backward.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \
        python -m benchmarks.flex_attention [--threads 2] [--reps 9] [--len 1024] [--mask causal]

Issue #28's case by default: causal block mask, batch 1, 8 heads, 1024 tokens, head dim 64,
float32. Each repetition times eager, ember and torch.compile once each, in rotating order (paired
and alternating), after warm-up; prints the median and the min-max spread per variant, and the
speedups of the medians. Values are checked against eager first.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import ember

MASKS = {
    "causal": lambda b, h, q, kv: q >= kv,
    "sliding": lambda b, h, q, kv: (q >= kv) & (q - kv <= 256),
}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--mask", default="causal", choices=sorted(MASKS))
    ap.add_argument("--bias", action="store_true", help="add a relative-position bias score_mod")
    ap.add_argument("--no-backward", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    L, H, D = args.len, args.heads, args.dim
    bm = create_block_mask(MASKS[args.mask], None, None, L, L, device="cpu")
    bias = torch.randn(2 * L - 1, requires_grad=True) * 0.1 if args.bias else None

    def rel(score, b, h, q, kv):
        return score + bias[q - kv + L - 1]

    def attn(q, k, v):
        return flex_attention(q, k, v, score_mod=rel if args.bias else None, block_mask=bm)

    variants = {"eager": attn, "ember": ember.compile(attn), "torch.compile": torch.compile(attn)}
    q, k, v = (torch.randn(1, H, L, D) for _ in range(3))
    ref = attn(q, k, v)
    for name, fn in variants.items():
        t0 = time.perf_counter()
        err = (fn(q, k, v) - ref).abs().max().item()
        print(f"{name:14s} first call {time.perf_counter() - t0:6.2f} s   max |err| vs eager "
              f"{err:.2e}")

    def fwd(fn):
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd(fn):
        fn(q, k, v).sum().backward()
        q.grad = k.grad = v.grad = None

    modes = [("forward", fwd)] + ([] if args.no_backward else [("forward+backward", fwd_bwd)])
    names = list(variants)
    print(f"threads={args.threads} L={L} heads={H} dim={D} mask={args.mask} bias={args.bias} "
          f"reps={args.reps}")
    for mode, run in modes:
        for fn in variants.values():      # warm-up (compiles the backward too)
            run(fn)
            run(fn)
        times = {n: [] for n in names}
        for r in range(args.reps):
            order = names[r % 3:] + names[:r % 3]
            for n in order:
                t0 = time.perf_counter()
                run(variants[n])
                times[n].append(time.perf_counter() - t0)
        med = {n: statistics.median(ts) for n, ts in times.items()}
        for n in names:
            ts = times[n]
            print(f"  {mode:17s} {n:14s} median {1e3 * med[n]:8.1f} ms  "
                  f"[{1e3 * min(ts):.1f} .. {1e3 * max(ts):.1f}]")
        print(f"  {mode:17s} ember vs eager {med['eager'] / med['ember']:.2f}x   "
              f"ember vs torch.compile {med['torch.compile'] / med['ember']:.2f}x")


if __name__ == "__main__":
    main()
