"""LLaMA's rotary embedding through view_as_complex / complex multiply / view_as_real on CPU:
eager vs ember with complex values left to aten externs (before issue #27's real pairs) vs
ember with them (now) vs torch.compile, inference and forward+backward.

    python benchmarks/rope_complex.py [--threads 1] [--rounds 11] [--batch 4] [--seq 512]

Default shape: batch 4, seq 512, 32 heads, head dim 128, float32 (q and k rotated;
--dtype bfloat16 for LLaMA's own dtype). "ember
before" is the same ember with `_complex_as_real_pairs` (backends/ember.py) switched off while
it compiles, so the complex ops run as aten externs as before. Variants are timed paired and
alternating (benchmarks/_timing.paired); prints per-variant median ms and min-max, and each
variant's speed vs eager (ratio of medians, per-round median and min-max).
"""
from __future__ import annotations

import argparse
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402

import ember  # noqa: E402
import ember.backends.ember as ember_backend  # noqa: E402


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def freqs(seq, dim, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    return torch.polar(torch.ones(seq, dim // 2), torch.outer(torch.arange(seq).float(), inv))


def train_step(fn):
    def step(q, k, f):
        a, b = fn(q, k, f)
        (a.sum() + b.sum()).backward()
    return step


def compile_before(fn, args):
    """ember with complex values as aten externs (the real-pair rewrite off while compiling)."""
    keep = ember_backend._complex_as_real_pairs
    ember_backend._complex_as_real_pairs = lambda gm, ex: gm
    try:
        c = ember.compile(lambda *a: fn(*a))
        c(*args)
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            out = c(*args)
            (out[0].sum() + out[1].sum()).backward()    # the backward compiles lazily
    finally:
        ember_backend._complex_as_real_pairs = keep
    return c


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="float32", help="q/k dtype (LLaMA runs bfloat16: then "
                    "x.float() and type_as are real casts around the complex multiply)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (args.batch, args.seq, args.heads, args.dim)
    f = freqs(args.seq, args.dim)
    dtype = getattr(torch, args.dtype)
    print(f"RoPE q,k {shape} {args.dtype}, {args.threads} thread(s), {args.rounds} rounds, "
          f"torch {torch.__version__}")
    for mode in ("inference", "train"):
        grad = mode == "train"
        q = torch.randn(shape, dtype=dtype, requires_grad=grad)
        k = torch.randn(shape, dtype=dtype, requires_grad=grad)
        inputs = (q, k, f)
        variants = {"eager": apply_rotary_emb,
                    "ember before": compile_before(apply_rotary_emb, inputs),
                    "ember": ember.compile(lambda *a: apply_rotary_emb(*a)),
                    "torch.compile": torch.compile(lambda *a: apply_rotary_emb(*a))}
        ref = apply_rotary_emb(*inputs)
        for name, fn in variants.items():
            out = fn(*inputs)
            for o, r in zip(out, ref):
                tol = 1e-5 if dtype == torch.float32 else 1e-2
                torch.testing.assert_close(o, r, atol=tol, rtol=tol)
        fns = {k: (train_step(v) if grad else (lambda fn: torch.no_grad()(fn))(v))
               for k, v in variants.items()}
        for fn in fns.values():           # warm-up (and the lazy backward compile)
            fn(*inputs)
            fn(*inputs)
        samples, reps = _timing.paired(fns, inputs, rounds=args.rounds)
        print(f"\n{mode} ({reps} calls per round)")
        for name, s in samples.items():
            r = _timing.ratio_stats(samples["eager"], s)
            print(f"  {name:14s} median {1e3 * statistics.median(s):7.2f} ms "
                  f"[{1e3 * min(s):.2f}-{1e3 * max(s):.2f}]   vs eager {r['of_medians']:.2f}x "
                  f"(per-round median {r['median']:.2f}x, {r['min']:.2f}-{r['max']:.2f})")
    from ember.backends.ember import STATS
    print("\nember graphs:", [{k: s[k] for k in ("kernels", "externs", "fallbacks")}
                              for s in STATS])


if __name__ == "__main__":
    main()
