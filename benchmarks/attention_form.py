"""CPU attention: eager's fused flash kernel vs the bmm form (two bmm around one scale+mask+
softmax kernel), the measurements behind ember/backends/attention.py (docs/design/031-attention-form.md).

Per shape [B, H, L, D] (q, k, v made as [B, L, H, D] and transposed, as a transformer's heads
are), causal or not, with an additive padding mask [B, 1, 1, L] or none, the attention written
out (`softmax(q @ k.transpose(-2, -1) * scale + mask) @ v`, a causal mask as an additive -inf
upper triangle) and run as:
  flash       eager F.scaled_dot_product_attention (the fused CPU kernel), the baseline
  chain       eager, as written
  ember_bmm   ember.compile, options={"attention": "as_written"}: bmm, one fused
              scale+mask+softmax kernel, bmm (ember's own bmm form)
  ember       ember.compile as users get it (the chain rewritten into the fused kernel)
Inference under no_grad, training as forward + autograd.grad of q, k, v. Timing: paired
alternating rounds (benchmarks/_timing.py), medians; "x" is flash's median time over the
candidate's (per-round ratios, median [quartiles]). EMBER_SPEED_CHECK=0 (ember's own kernels),
EMBER_BACKEND_CACHE=0.

    python benchmarks/attention_form.py [--threads 1] [--rounds 9] [--mode infer|train|both]
        [--grid full|quick] [--json out.jsonl]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402

FULL = dict(bh=[(1, 2), (1, 12), (4, 8), (8, 12)], seq=[50, 77, 128, 197, 256, 512, 1024],
            dim=[32, 64, 128])
QUICK = dict(bh=[(1, 12), (8, 12)], seq=[128, 256, 512], dim=[64])


def cases(grid):
    for (b, h), n, d in itertools.product(grid["bh"], grid["seq"], grid["dim"]):
        yield b, h, n, d, False, False
        if d == 64:
            yield b, h, n, d, True, False
            yield b, h, n, d, False, True


def main(argv=None) -> int:
    _timing.prepare()
    os.environ["EMBER_SPEED_CHECK"] = "0"
    os.environ["EMBER_BACKEND_CACHE"] = "0"     # the forced and the automatic compile share a key
    import torch
    import torch.nn.functional as F
    import ember

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--mode", default="both", choices=["infer", "train", "both"])
    ap.add_argument("--grid", default="full", choices=["full", "quick"])
    ap.add_argument("--max-scores", type=float, default=6e7, help="skip shapes with more scores")
    ap.add_argument("--seq", default=None, help="comma list: only these sequence lengths")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = open(args.json, "a") if args.json else None
    modes = ["infer", "train"] if args.mode == "both" else [args.mode]
    for mode, (b, h, n, d, causal, masked) in itertools.product(
            modes, cases(FULL if args.grid == "full" else QUICK)):
        if b * h * n * n > args.max_scores or args.seq and n not in map(int, args.seq.split(",")):
            continue
        torch.manual_seed(0)
        train = mode == "train"
        q, k, v = (torch.randn(b, n, h, d).transpose(1, 2).requires_grad_(train) for _ in range(3))
        mask = torch.zeros(b, 1, 1, n).masked_fill(torch.rand(b, 1, 1, n) < 0.2, float("-inf")) \
            if masked else None
        mask = mask if mask is None else mask.index_fill(-1, torch.tensor([0]), 0.0)
        g = torch.randn(b, h, n, d)

        causal_mask = torch.full((n, n), float("-inf")).triu(1) if causal else None
        scale = d ** -0.5

        def flash(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

        def chain(q, k, v, mask):
            s = q @ k.transpose(-2, -1) * scale
            s = s + mask if mask is not None else s
            s = s + causal_mask if causal_mask is not None else s
            return s.softmax(dim=-1) @ v

        def step(f):
            if not train:
                def run():
                    with torch.no_grad():
                        return f(q, k, v, mask)
            else:
                def run():
                    return torch.autograd.grad(f(q, k, v, mask), (q, k, v), g)
            return run

        # own code objects: ember caches compiled code per code object
        def twin(name):
            return types.FunctionType(chain.__code__.replace(co_name=name), chain.__globals__,
                                      name, None, chain.__closure__)
        bmm_form = ember.compile(twin("bmm_form"), options={"attention": "as_written"})
        auto = ember.compile(twin("auto"))
        fns = {"flash": step(flash), "chain": step(chain), "ember_bmm": step(bmm_form),
               "ember": step(auto)}
        for f in fns.values():
            f()
        ref = fns["flash"]()
        err = {}
        for name in ("ember_bmm", "ember"):
            got = fns[name]()
            err[name] = max((a - r).abs().max().item() for a, r in zip(
                got if train else [got], ref if train else [ref]))
        samples, reps = _timing.paired(fns, rounds=args.rounds, target_s=0.04)
        row = dict(mode=mode, B=b, H=h, L=n, D=d, causal=causal, mask=masked, max_err=err,
                   threads=args.threads, reps=reps, load=os.getloadavg()[0],
                   flash_ms=statistics.median(samples["flash"]) * 1e3)
        line = ""
        for name in ("chain", "ember_bmm", "ember"):
            r = _timing.ratio_stats(samples["flash"], samples[name])
            row[name] = {"x": round(r["median"], 3), "p25": round(r["p25"], 3),
                         "p75": round(r["p75"], 3)}
            line += f"  {name} {r['median']:.2f}x [{r['p25']:.2f},{r['p75']:.2f}]"
        print(f"{mode:5s} B={b} H={h:2d} L={n:4d} D={d:3d} causal={causal:d} mask={masked:d} "
              f"flash {row['flash_ms']:.3f}ms{line}  err {max(err.values()):.1e}", flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        ember.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
