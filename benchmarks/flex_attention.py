"""flex_attention on CPU: eager vs ember vs torch.compile, forward and forward+backward.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \
        python -m benchmarks.flex_attention [--threads 2] [--reps 9] [--len 1024] [--mask causal]

Issue #28's case by default: causal block mask, batch 1, 8 heads, 1024 tokens, head dim 64,
float32. Each repetition times every variant once, in rotating order (paired and alternating),
after warm-up; prints the median and the min-max spread per variant, and the speedups of the
medians. Values are checked against eager first.

Forward: eager flex_attention, ember.compile'd and torch.compile'd. Forward+backward: PyTorch's
flex_attention has no CPU backward (eager and torch.compile raise NotImplementedError when an
input requires grad), so ember's flex_attention is timed against the same attention written as
dense torch ops (scores, score_mod on broadcast indices, mask, softmax, @ v), eager and
torch.compile'd.
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
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with process CPU time (less sensitive to other load on a shared "
                         "machine; with --threads 1 it is the work done)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    L, H, D = args.len, args.heads, args.dim
    bm = create_block_mask(MASKS[args.mask], None, None, L, L, device="cpu")
    bias = (torch.randn(2 * L - 1) * 0.1).requires_grad_() if args.bias else None

    def rel(score, b, h, q, kv):
        return score + bias[q - kv + L - 1]

    def attn(q, k, v):
        return flex_attention(q, k, v, score_mod=rel if args.bias else None, block_mask=bm)

    def dense(q, k, v):
        i = torch.arange(L)
        qi, kj = i.view(1, 1, L, 1), i.view(1, 1, 1, L)
        s = q @ k.transpose(-1, -2) * D ** -0.5
        if args.bias:
            s = rel(s, None, None, qi, kj)
        s = s.masked_fill(~MASKS[args.mask](None, None, qi, kj), float("-inf"))
        return torch.softmax(s, -1) @ v

    clock = time.process_time if args.cpu_time else time.perf_counter
    mk = lambda: [torch.randn(1, H, L, D) for _ in range(3)]          # noqa: E731
    q, k, v = mk()
    print(f"threads={args.threads} L={L} heads={H} dim={D} mask={args.mask} bias={args.bias} "
          f"reps={args.reps} clock={'process CPU time' if args.cpu_time else 'wall'}")
    fwd = {"eager": attn, "ember": ember.compile(attn), "torch.compile": torch.compile(attn)}
    with torch.no_grad():
        report("forward", fwd, lambda fn: fn(q, k, v), attn(q, k, v), args.reps, clock)
    if args.no_backward:
        return
    qg, kg, vg = (t.requires_grad_() for t in mk())
    bwd = {"eager dense": dense, "ember flex": ember.compile(attn),
           "torch.compile dense": torch.compile(dense)}

    def fwd_bwd(fn):
        out = fn(qg, kg, vg)
        out.sum().backward()
        qg.grad = kg.grad = vg.grad = None
        return out
    with torch.no_grad():
        ref = dense(qg, kg, vg)
    report("forward+backward", bwd, fwd_bwd, ref, args.reps, clock)


def report(mode, variants, run, ref, reps, clock):
    names = list(variants)
    for name, fn in variants.items():
        t0 = time.perf_counter()
        err = (run(fn) - ref).abs().max().item()
        run(fn)
        run(fn)                               # warm-up: backward compiled, speed checks done
        print(f"  {mode:17s} {name:20s} first calls {time.perf_counter() - t0:6.2f} s   "
              f"max |err| vs eager {err:.2e}")
    times = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % 3:] + names[:r % 3]:
            t0 = clock()
            run(variants[n])
            times[n].append(clock() - t0)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    for n in names:
        ts = times[n]
        print(f"  {mode:17s} {n:20s} median {1e3 * med[n]:8.1f} ms  "
              f"[{1e3 * min(ts):.1f} .. {1e3 * max(ts):.1f}]")
    e = next(n for n in names if n.startswith("ember"))
    a, c = (n for n in names if n != e)
    print(f"  {mode:17s} ember vs {a}: {med[a] / med[e]:.2f}x   ember vs {c}: "
          f"{med[c] / med[e]:.2f}x")


if __name__ == "__main__":
    main()
