"""Eager vs ember (vs torch.compile with --torch) on the row kernels of design 074:

- relpos_KHxKW: decomposed relative-position attention softmax (timm MViTv2's cal_rel_pos):
  softmax(attn.view(.., qh, qw, kh, kw) + rel_h[..., None] + rel_w[..., None, :]) over the
  kh*kw keys: a row reduction whose loads read rel_h at v // kw and rel_w at v % kw, twice per
  row (the max pass and the exp/sum pass);
- gelumean_C: gelu of a channels-last [B, C, H, W] tensor stored, and its mean over (H, W)
  (GCViT's MBConv squeeze-excite input): a reduction with a pointwise store in the same stage.

1 thread, CPU time of this thread per call, paired alternating rounds (benchmarks/_timing.py).

    EMBER_SPEED_CHECK=0 python benchmarks/relpos_micro.py [--only REGEX] [--rounds 7] [--torch]
"""
import argparse
import re
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402


def relpos_case(b, h, q, k):
    (qh, qw), (kh, kw) = q, k

    def relpos(attn, rh, rw):
        a = attn.view(b, h, qh, qw, kh, kw) + rh[..., None] + rw[..., None, :]
        return a.view(b, h, qh * qw, kh * kw).softmax(-1)
    args = (torch.randn(b, h, qh * qw, kh * kw), torch.randn(b, h, qh, qw, kh),
            torch.randn(b, h, qh, qw, kw))
    return f"relpos_{kh}x{kw}", relpos, args


def gelumean(x):
    y = F.gelu(x)
    return y, y.mean((2, 3), keepdim=True)


def cases():
    yield relpos_case(4, 1, (56, 56), (7, 7))
    yield relpos_case(4, 2, (28, 28), (14, 14))
    yield relpos_case(4, 1, (28, 28), (28, 28))
    yield relpos_case(4, 2, (14, 14), (13, 11))
    for c, hw in ((64, 56), (128, 28), (96, 27)):
        x = torch.randn(4, c, hw, hw).to(memory_format=torch.channels_last)
        yield f"gelumean_{c}", gelumean, (x,)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default=".")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--torch", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{'case':14} {'eager ms':>9} {'ember ms':>9} {'x eager':>8} {'p25-p75':>11}"
          + (f" {'torch ms':>9}" if args.torch else ""))
    for name, fn, inp in cases():
        if not re.search(args.only, name):
            continue
        fns = {"eager": fn, "ember": ember.compile(fn, dynamic=False)}
        if args.torch:
            fns["torch"] = torch.compile(fn, dynamic=False)
        ref = fn(*inp)
        for k in fns:
            torch.testing.assert_close(fns[k](*inp), ref, rtol=1e-4, atol=1e-4)
        s, _ = _timing.paired(fns, inp, rounds=args.rounds)
        r = _timing.ratio_stats(s["eager"], s["ember"])
        med = {k: statistics.median(v) * 1e3 for k, v in s.items()}
        print(f"{name:14} {med['eager']:9.3f} {med['ember']:9.3f} {r['median']:8.2f} "
              f"{r['p25']:5.2f}-{r['p75']:5.2f}"
              + (f" {med['torch']:9.3f}" if args.torch else ""), flush=True)


if __name__ == "__main__":
    main()
