"""Eager vs ember (vs torch.compile with --torch) on kernels that read an input transposed
relative to their loop order, at power-of-two and odd strides (design 068):

- tsum_C:  (a * x.transpose(1, 2)).sum(-1), a [B, C, L] contiguous, x [B, L, C]: a row
  reduction over L whose simd loop reads x at stride C (HF Mamba2's D / dt gradients);
- tcopy_C: x.transpose(1, 2) + 1 into a contiguous [B, C, L] (a layout conversion: the store
  is contiguous along L, the load strides by C).

1 thread, CPU time of this thread per call, paired alternating rounds (benchmarks/_timing.py).

    EMBER_SPEED_CHECK=0 python benchmarks/tstride_micro.py [--only REGEX] [--rounds 7] [--torch]
"""
import argparse
import re
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402

import ember  # noqa: E402

STRIDES = (64, 127, 128, 512, 768)
ELEMS = 1 << 20         # elements of x per case


def tsum(a, x):
    return (a * x.transpose(1, 2)).sum(-1)


def tcopy(x):
    return x.transpose(1, 2) + 1


def cases():
    for c in STRIDES:
        B, L = 4, ELEMS // (4 * c)
        a, x = torch.randn(B, c, L), torch.randn(B, L, c)
        yield f"tsum_{c}", tsum, (a, x)
        yield f"tcopy_{c}", tcopy, (x,)


def main(cases=cases, width=10):
    """Time each (name, fn, inputs) of `cases()` eager vs ember (also used by relpos_micro.py)."""
    p = argparse.ArgumentParser()
    p.add_argument("--only", default=".")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--torch", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{'case':{width}} {'eager ms':>9} {'ember ms':>9} {'x eager':>8} {'p25-p75':>11}"
          + (f" {'torch ms':>9}" if args.torch else ""))
    for name, fn, inp in cases():
        if not re.search(args.only, name):
            continue
        fns = {"eager": fn, "ember": ember.compile(fn, dynamic=False)}
        if args.torch:
            fns["torch"] = torch.compile(fn, dynamic=False)
        ref = fn(*inp)
        for k in fns:
            out = fns[k](*inp)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        s, _ = _timing.paired(fns, inp, rounds=args.rounds)
        r = _timing.ratio_stats(s["eager"], s["ember"])
        med = {k: statistics.median(v) * 1e3 for k, v in s.items()}
        print(f"{name:{width}} {med['eager']:9.3f} {med['ember']:9.3f} {r['median']:8.2f} "
              f"{r['p25']:5.2f}-{r['p75']:5.2f}"
              + (f" {med['torch']:9.3f}" if args.torch else ""), flush=True)


if __name__ == "__main__":
    main()
