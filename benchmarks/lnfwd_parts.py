"""Inference normalization forward, by part: eager vs ember's call, its wrapper with reused
outputs (no allocation), and its one C++ kernel alone (ctypes, same buffers). docs/design/089.

    PYTHONPATH=. python benchmarks/lnfwd_parts.py [--cases REGEX] [--rounds 11]

Paired alternating rounds in one process (_timing.paired), 1 thread, thread CPU time,
EMBER_SPEED_CHECK=0 (ember's own kernels). Prints ms per call (medians) and eager / part with
the per-round ratios' quartiles. `call - wrapper` is the output allocation, `wrapper - kernel`
the Python wrapper and guards.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import tempfile

import _timing

_timing.prepare()
os.environ["EMBER_SPEED_CHECK"] = "0"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.codegen.wrapper import wrapper_globals  # noqa: E402
from ember.runtime.build import build, load  # noqa: E402


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CASES = {   # name: (fn, input shape, param shape or None)
    "ln_8x512x768": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5), (8, 512, 768), -1),
    "ln_8x197x768": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5), (8, 197, 768), -1),
    "ln_64x512x1024": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5), (64, 512, 1024), -1),
    "rms_8x512x4096": (lambda x, w, b: _rms(x, w), (8, 512, 4096), -1),
    "gn_8x256x28x28": (lambda x, w, b: F.group_norm(x, 32, w, b, 1e-5), (8, 256, 28, 28), 1),
    "varmean_4096x768": (lambda x, w, b: torch.var_mean(x, -1), (4096, 768), None),
}


def _kernel_parts(cache_dir, args):
    """(wrapper with reused outputs, kernel alone) of the one graph in cache_dir."""
    (path,) = glob.glob(os.path.join(cache_dir, "graphs", "*", "*.json"))
    entry = json.loads(json.load(open(path))["payload"])
    globs = wrapper_globals()
    globs.update(load(build(entry["source"]), entry["sigs"]))
    kernels = [k for k in entry["sigs"]]
    assert len(kernels) == 1, kernels
    made: list = []

    def reuse(*a, **kw):
        if len(made) < reuse.n:
            made.append(torch.empty_strided(*a, **kw))
        t = made[reuse.i % len(made)]
        reuse.i += 1
        return t
    reuse.i, reuse.n = 0, len(re.findall(r"empty_strided\(", entry["wrapper"]))
    globs["empty_strided"] = reuse
    exec(compile(entry["wrapper"], "<wrapper>", "exec"), globs)
    call = globs["call"]
    args = args[:len(re.match(r"def call\(args\):\n *(.*) = args", entry["wrapper"]).group(1).split(",")) - 1]
    seen = []
    kfn = globs[kernels[0]]
    globs[kernels[0]] = lambda *p: (seen.append(p), kfn(*p))
    call(list(args))
    globs[kernels[0]] = kfn
    ptrs = seen[0]
    return (lambda: call(list(args))), (lambda: kfn(*ptrs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=".")
    ap.add_argument("--rounds", type=int, default=11)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name, (fn, shape, pshape) in CASES.items():
        if not re.search(a.cases, name):
            continue
        torch.manual_seed(0)
        x = torch.randn(*shape)
        n = shape[pshape] if pshape is not None else 1
        w, b = torch.randn(n), torch.randn(n)
        cache = os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="lnfwd-")   # one graph
        ember.reset()
        f = ember.compile(fn)
        with torch.no_grad():
            f(x, w, b)
            wrapper, kernel = _kernel_parts(cache, [x, w, b])
            fns = {"eager": lambda: fn(x, w, b), "ember": lambda: f(x, w, b),
                   "wrapper": wrapper, "kernel": kernel}
            s, reps = _timing.paired(fns, (), a.rounds)
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in s.items()}
        line = [f"{name}: eager {med['eager']:.3f} ms"]
        for k in ("ember", "wrapper", "kernel"):
            r = _timing.ratio_stats(s["eager"], s[k])
            line.append(f"{k} {med[k]:.3f} ms ({r['median']:.2f}x [{r['p25']:.2f}-{r['p75']:.2f}])")
        print(", ".join(line), f"reps {reps}", flush=True)


if __name__ == "__main__":
    main()
