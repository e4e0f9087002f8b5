"""The C++ prelude's float math alone (exp, log, sigmoid, silu, tanh, gelu), one op a loop, vs
eager, in thread CPU time with one thread (paired alternating rounds, medians): the kernels
without ember's call path or speed check, on data in cache (--size 65536) or in memory.
`--base DIR` also times another checkout's prelude (A/B of a prelude change in one process).

    python benchmarks/prelude_math.py [--size 65536] [--rounds 15] [--base /work/main]
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ember.runtime import build  # noqa: E402

# name -> (C++ expression of float x, eager function, input from a standard normal)
OPS = {
    "exp": ("ember::exp(x)", torch.exp, lambda b: b * 4),
    "log": ("ember::log(x)", torch.log, lambda b: b.abs() + 1e-3),
    "sigmoid": ("ember::sigmoid(x)", torch.sigmoid, lambda b: b * 4),
    "silu": ("x * ember::sigmoid(x)", F.silu, lambda b: b),
    "tanh": ("ember::tanh(x)", torch.tanh, lambda b: b * 2),
    "gelu": ("(x * 0.5f) * (1.0f + ember::erf(x * 0.7071067811865476f))", F.gelu, lambda b: b),
}


def _prelude(root: str) -> str:
    spec = importlib.util.spec_from_file_location(
        "prelude_" + hashlib.md5(root.encode()).hexdigest(), os.path.join(root, "ember/codegen/cpp_prelude.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PRELUDE


def _library(prelude: str, tmp: str):
    src = prelude + "".join(f"""
extern "C" void k_{n}(const float* a, float* o, int64_t n) {{
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) {{ float x = a[i]; o[i] = {expr}; }}
}}""" for n, (expr, _, _) in OPS.items())
    path = os.path.join(tmp, hashlib.md5(src.encode()).hexdigest())
    with open(path + ".cpp", "w") as f:
        f.write(src)
    subprocess.run([build.CXX, *build.FLAGS, path + ".cpp", "-o", path + ".so", *build.LIBS], check=True)
    return ctypes.CDLL(path + ".so")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--base", default=None, help="another checkout whose prelude to time too")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="ember-prelude-")
    libs = {"ember": _library(_prelude(root), tmp)}
    if args.base:
        libs["base"] = _library(_prelude(args.base), tmp)
    reps = max(5, 5 * (2 ** 21 // args.size))
    torch.manual_seed(0)
    base = torch.randn(args.size)
    print(f"size {args.size}, {args.rounds} rounds x {reps} calls, thread CPU time, 1 thread")
    for name, (_, fn, make) in OPS.items():
        x = make(base).contiguous()
        out = torch.empty_like(x)
        ref = fn(x)
        fns = {"eager": lambda: fn(x)}
        errs = []
        for k, lib in libs.items():
            kern = getattr(lib, f"k_{name}")
            fns[k] = (lambda kern: lambda: kern(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                                 ctypes.c_int64(x.numel())))(kern)
            fns[k]()
            errs.append(f"{k} err {float((out - ref).abs().max() / ref.abs().max()):.1e}")
        t = {k: [] for k in fns}
        for r in range(args.rounds):
            for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t0 = time.thread_time()
                for _ in range(reps):
                    fns[k]()
                t[k].append((time.thread_time() - t0) / reps)
        cols = []
        for k in libs:
            rs = sorted(a / b for a, b in zip(t["eager"], t[k]))
            cols.append(f"{k} {statistics.median(t[k]) * 1e3:7.4f} ms {statistics.median(rs):.2f}x "
                        f"[{rs[len(rs) // 4]:.2f}-{rs[3 * len(rs) // 4]:.2f}]")
        print(f"{name:8s} eager {statistics.median(t['eager']) * 1e3:7.4f} ms  " + "  ".join(cols)
              + "  " + ", ".join(errs), flush=True)


if __name__ == "__main__":
    sys.exit(main())
