"""Every elementwise math function eager PyTorch vectorizes, one op a graph, eager vs ember (and
torch.compile with --torch): ember's kernels must not lose to eager's on the functions themselves
(a scalar libm call a lane made sin 10x and atan 20x slower than eager before libmvec).

    python benchmarks/elementwise_math.py [--only REGEX] [--rounds 11] [--torch] [--threads 1]

Inputs are 1024x2048 float32 inside each function's domain. Prints ms per call (medians of
paired alternating rounds), ember's speed vs eager (median of per-round ratios) and max |error|
vs eager relative to max |eager|.
"""
from __future__ import annotations

import argparse
import re
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402

# name -> (function, input maker on a standard normal x)
OPS = {
    "sin": (torch.sin, lambda x: x * 4), "cos": (torch.cos, lambda x: x * 4),
    "tan": (torch.tan, lambda x: x.clamp(-1.5, 1.5)), "asin": (torch.asin, lambda x: x.tanh()),
    "acos": (torch.acos, lambda x: x.tanh()), "atan": (torch.atan, lambda x: x * 4),
    "sinh": (torch.sinh, lambda x: x * 4), "cosh": (torch.cosh, lambda x: x * 4),
    "asinh": (torch.asinh, lambda x: x * 4), "acosh": (torch.acosh, lambda x: x.abs() + 1),
    "atanh": (torch.atanh, lambda x: x.tanh()), "exp": (torch.exp, lambda x: x * 4),
    "exp2": (torch.exp2, lambda x: x * 4), "expm1": (torch.expm1, lambda x: x),
    "log": (torch.log, lambda x: x.abs() + 1e-3), "log2": (torch.log2, lambda x: x.abs() + 1e-3),
    "log10": (torch.log10, lambda x: x.abs() + 1e-3), "log1p": (torch.log1p, lambda x: x.abs()),
    "sqrt": (torch.sqrt, lambda x: x.abs()), "rsqrt": (torch.rsqrt, lambda x: x.abs() + 1e-3),
    "tanh": (torch.tanh, lambda x: x * 2), "sigmoid": (torch.sigmoid, lambda x: x * 4),
    "erf": (torch.erf, lambda x: x), "erfc": (torch.erfc, lambda x: x),
    "erfinv": (torch.erfinv, lambda x: x.tanh()), "lgamma": (torch.lgamma, lambda x: x.abs() + 0.1),
    "gelu": (F.gelu, lambda x: x), "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), lambda x: x),
    "silu": (F.silu, lambda x: x), "mish": (F.mish, lambda x: x), "softplus": (F.softplus, lambda x: x),
    "pow_1.5": (lambda t: t ** 1.5, lambda x: x.abs()), "pow_tensor": (lambda t: t ** (t * 0.1),
                                                                        lambda x: x.abs() + 0.1),
    "atan2": (lambda t: torch.atan2(t, t.flip(-1)), lambda x: x),
    "hypot": (lambda t: torch.hypot(t, t.flip(-1)), lambda x: x),
    "logit": (torch.logit, lambda x: x.sigmoid()),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=".*")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--torch", action="store_true", help="also time torch.compile (Inductor)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = torch.randn(1024, 2048)
    print(f"{'op':12s} {'eager ms':>9s} {'ember ms':>9s} {'ember/eager':>12s} "
          f"{'[p25-p75]':>12s}" + (f" {'inductor':>9s}" if args.torch else "") + "  max rel err")
    ratios = []
    for name, (fn, make) in OPS.items():
        if not re.search(args.only, name):
            continue
        x = make(base).contiguous()
        fns = {"eager": fn, "ember": ember.compile(fn)}
        if args.torch:
            fns["inductor"] = torch.compile(fn)
        with torch.no_grad():
            ref = fn(x)
            err = float((fns["ember"](x) - ref).abs().max() / ref.abs().max())
            samples, _ = _timing.paired(fns, (x,), args.rounds)
        r = _timing.ratio_stats(samples["eager"], samples["ember"])
        ratios.append(r["median"])
        med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        extra = f" {med['eager'] / med['inductor']:8.2f}x" if args.torch else ""
        print(f"{name:12s} {med['eager']:9.3f} {med['ember']:9.3f} {r['median']:11.2f}x "
              f"[{r['p25']:.2f}-{r['p75']:.2f}]{extra}  {err:.1e}", flush=True)
    if ratios:
        print(f"geomean ember/eager {statistics.geometric_mean(ratios):.2f}x over {len(ratios)} ops; "
              f"below 0.95x: {sum(r < 0.95 for r in ratios)}")


if __name__ == "__main__":
    main()
