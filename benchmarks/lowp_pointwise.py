"""Eager vs ember on fp16 / bf16 pointwise, norm and softmax patterns, paired rounds in one process.

    python benchmarks/lowp_pointwise.py [--shape 4,256,768] [--dtypes float16,bfloat16]
        [--only REGEX] [--rounds 15] [--speed-check] [--json OUT]
    python benchmarks/lowp_pointwise.py --models b_hf_bert,b_hf_gpt2 [--dtypes ...] [--rounds 9]

Cases: gelu, layer_norm, softmax, silu_mul (silu(x) * y), add_relu, rmsnorm (x * rsqrt(mean(x^2)
+ eps) * w, computed in float like HF's LlamaRMSNorm, cast back). Inputs and outputs are in the
low-precision dtype. 1 intra-op thread; seconds are the calling thread's CPU time
(_timing.time_call); the speed check is off unless --speed-check (so ember's kernels are what
is measured). Prints per case the medians and eager/ember (> 1: ember faster) with the quartiles
of the per-round ratios (the spread), and the max |ember - eager| in units of the dtype's eps.
--models: broad-suite models (ember.bench.broad) cast to the dtype, inference under no_grad, eager
vs ember with the speed check off and on (two compiled copies), paired the same way; the error
is max |ember - eager| / max |eager| of the first output.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys

import _timing

if __name__ == "__main__":
    _timing.prepare()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402


def rmsnorm(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


CASES = {   # name -> (fn, extra inputs beyond x as shapes: "x" same as x, "d" last dim)
    "gelu": (lambda x: F.gelu(x), ()),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), ()),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), ("d", "d")),
    "softmax": (lambda x: torch.softmax(x, -1), ()),
    "silu_mul": (lambda x, y: F.silu(x) * y, ("x",)),
    "add_relu": (lambda x, y: torch.relu(x + y), ("x",)),
    "rmsnorm": (rmsnorm, ("d",)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,256,768")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--only", default=".")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--speed-check", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--models", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    shape = [int(v) for v in a.shape.split(",")]
    rows = models(a) if a.models else []
    for dname in a.dtypes.split(",") if not a.models else ():
        dtype = getattr(torch, dname)
        for name, (fn, extra) in CASES.items():
            if not re.search(a.only, name):
                continue
            g = torch.Generator().manual_seed(0)
            args = [torch.randn(shape, generator=g).to(dtype)]
            args += [torch.randn(shape if e == "x" else shape[-1:], generator=g).to(dtype)
                     for e in extra]
            ember.reset()
            compiled = ember.compile(fn, options={"speed_check": a.speed_check})
            with torch.no_grad():
                want, got = fn(*args), compiled(*args)
                err = (got.float() - want.float()).abs().max().item() / torch.finfo(dtype).eps
                s, reps = _timing.paired({"eager": fn, "ember": compiled}, args, a.rounds)
            st = _timing.ratio_stats(s["eager"], s["ember"])
            med = {k: sorted(v)[len(v) // 2] for k, v in s.items()}
            row = {"case": name, "dtype": dname, "shape": shape, "eager_ms": med["eager"] * 1e3,
                   "ember_ms": med["ember"] * 1e3, "ratio": st["of_medians"],
                   "p25": st["p25"], "p75": st["p75"], "err_eps": err, "reps": reps}
            rows.append(row)
            print(f"{dname:9s} {name:11s} eager {row['eager_ms']:7.3f} ms  ember "
                  f"{row['ember_ms']:7.3f} ms  eager/ember {row['ratio']:5.2f} "
                  f"[{st['p25']:.2f}, {st['p75']:.2f}]  max err {err:.1f} eps", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


def _first(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return next(iter(out.values()))
    return _first(out[0])


def models(a) -> list[dict]:
    from ember.bench import broad, suites  # noqa: F401 - registers the models
    from ember.bench.spec import REGISTRY
    rows = []
    for model in a.models.split(","):
        spec = REGISTRY[model]
        for dname in a.dtypes.split(","):
            dtype = getattr(torch, dname)
            torch.manual_seed(0)
            m = spec.build().eval().to(dtype)
            args, kw = spec.inputs(), spec.kwargs()
            args = [x.to(dtype) if x.is_floating_point() else x for x in args]
            ember.reset()
            fns = {"eager": m,
                   "ember_off": ember.compile(copy.deepcopy(m), options={"speed_check": False}),
                   "ember_on": ember.compile(copy.deepcopy(m), options={"speed_check": True})}

            def call(f):
                with torch.no_grad():
                    return f(*args, **kw)
            want = _first(call(m)).float()
            errs = {k: ((_first(call(f)).float() - want).abs().max() / want.abs().max()).item()
                    for k, f in fns.items() if k != "eager"}
            s, reps = _timing.paired({k: (lambda f=f: call(f)) for k, f in fns.items()}, (),
                                     a.rounds)
            med = {k: sorted(v)[len(v) // 2] for k, v in s.items()}
            for k in ("ember_off", "ember_on"):
                st = _timing.ratio_stats(s["eager"], s[k])
                row = {"model": model, "dtype": dname, "speed_check": k == "ember_on",
                       "eager_ms": med["eager"] * 1e3, "ember_ms": med[k] * 1e3,
                       "ratio": st["of_medians"], "p25": st["p25"], "p75": st["p75"],
                       "rel_err": errs[k], "reps": reps}
                rows.append(row)
                print(f"{model} {dname:9s} speed check {'on ' if row['speed_check'] else 'off'} "
                      f"eager {row['eager_ms']:7.2f} ms  ember {row['ember_ms']:7.2f} ms  "
                      f"eager/ember {row['ratio']:5.2f} [{st['p25']:.2f}, {st['p75']:.2f}]  "
                      f"rel err {errs[k]:.1e}", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
