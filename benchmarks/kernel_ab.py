"""Kernel-level A/B of the C++ code generator: the same hand-built kernels through a base
revision's codegen and through this tree's, built and timed in one process, alternating.

    python benchmarks/kernel_ab.py --base REV [--threads 1] [--rounds 21] [--only REGEX]

The base revision's `ember` package is extracted with `git archive REV` into a temporary dir as
package `ember_base` (its stages import each other relatively, so both load side by side). Each
case is a float32 sum over some dims of a random input, built as loop IR (`Reduction` node),
or a copy of the input into the other memory layout (a layout conversion, NCHW <-> NHWC),
scheduled, generated, compiled with g++ and loaded by each version's own modules. Per case:
median seconds per call of each, the per-round speed ratio base/this (median and quartiles: the
spread), and each result's max error against the float64 result, relative to sum|x| of its row
(a copy: max |error|, which must be 0).
`--threads` sets OMP_NUM_THREADS (the kernels' OpenMP) before anything loads.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import _timing

ROOT = _timing.ROOT
CASES = {   # name -> (input shape, summed dims or None for a layout conversion, channels_last in)
    "nhwc_to_nchw": ((8, 256, 28, 28), None, True),
    "nchw_to_nhwc": ((8, 128, 28, 28), None, False),
    "nchw_to_nhwc_rgb": ((8, 3, 224, 224), None, False),
    "nchw_to_nhwc_144x56x56": ((8, 144, 56, 56), None, False),
    "nhwc_to_nchw_144x56x56": ((8, 144, 56, 56), None, True),
    "bn_stats_nchw": ((8, 64, 112, 112), (0, 2, 3), False),
    "bn_stats_nhwc": ((8, 64, 112, 112), (0, 2, 3), True),
    "sum_all_1M": ((1 << 20,), (0,), False),
    "sum_dim0_8192x768": ((8192, 768), (0,), False),
    "rows_64x100k": ((64, 100_000), (1,), False),
    "groupnorm_32g_stats": ((8, 32, 2 * 56 * 56), (2,), False),
    "short_last_dim": ((1 << 17, 4, 7), (0, 2), False),
}
MODULES = ("loopir.nodes", "loopir.ops", "codegen.cpp", "runtime.build", "schedule.deps",
           "schedule.fuse", "schedule.memory")


def extract_base(rev: str) -> str:
    """`ember` at `rev` as package `ember_base` in a temporary dir; returns the dir."""
    tmp = tempfile.mkdtemp(prefix="ember-ab-")
    data = subprocess.run(["git", "-C", ROOT, "archive", rev, "ember"], check=True,
                          capture_output=True).stdout
    path = os.path.join(tmp, "base.tar")
    with open(path, "wb") as f:
        f.write(data)
    with tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")
    os.rename(os.path.join(tmp, "ember"), os.path.join(tmp, "ember_base"))
    return tmp


def kernel(pkg: str, x, dims):
    """(call(), result tensor) for sum(x, dims) (dims None: x copied into the other layout)
    through package `pkg`'s codegen."""
    import torch
    m = {k: importlib.import_module(f"{pkg}.{k}") for k in MODULES}
    nodes = m["loopir.nodes"]
    inp = nodes.InputBuffer("arg0", torch.float32, tuple(x.shape), x.stride(), position=0)
    load = inp.loader()
    if dims is None:
        out_shape = tuple(x.shape)
        fmt = torch.channels_last if x.is_contiguous() else torch.contiguous_format
        res = torch.empty(out_shape, memory_format=fmt)
        out = nodes.ComputedBuffer("buf0", torch.float32, out_shape, res.stride(),
                                   body=nodes.Pointwise(out_shape, torch.float32, load))
    else:
        keep = [d for d in range(x.dim()) if d not in dims]
        out_shape = tuple(x.shape[d] for d in keep)
        res = torch.empty(out_shape)

        def body(i, r):
            it, ir = iter(i), iter(r)
            return load([next(ir) if d in dims else next(it) for d in range(x.dim())])
        out = nodes.ComputedBuffer("buf0", torch.float32, out_shape, res.stride(),
                                   body=nodes.Reduction(out_shape, tuple(x.shape[d] for d in dims),
                                                        "sum", torch.float32, torch.float32, body))
    deps = {out.name: m["schedule.deps"].node_deps(out)}
    steps = m["schedule.fuse"].fuse([out], deps)
    m["schedule.memory"].mark_locals(steps, deps, keep={out.name})
    src, sigs = m["codegen.cpp"].generate_tu(steps, deps, {"arg0": inp, "buf0": out})
    fns = m["runtime.build"].load(m["runtime.build"].build(src), sigs)
    name = steps[0].name
    ptrs = [{"arg0": x, "buf0": res}[a].data_ptr() for a in sigs[name]]
    return (lambda: fns[name](*ptrs)), res     # (fns holds the loaded library)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--only", default="", help="regex over case names")
    a = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    _timing.prepare()
    sys.path.insert(0, extract_base(a.base))
    import torch
    torch.manual_seed(0)
    print(f"# kernel A/B: base {a.base} vs this tree; OMP threads {a.threads}, {a.rounds} rounds")
    print(f"{'case':22s} {'base ms':>8s} {'this ms':>8s}  this speed / base [p25-p75]  "
          f"err base / this (of sum|x|)")
    for name, (shape, dims, cl) in CASES.items():
        if not re.search(a.only, name):
            continue
        x = torch.randn(*shape)
        if cl:
            x = x.to(memory_format=torch.channels_last)
        calls = {pkg: kernel(pkg, x, dims) for pkg in ("ember_base", "ember")}
        fns = {pkg: c[0] for pkg, c in calls.items()}
        for f in fns.values():
            f()
        samples, _ = _timing.paired(fns, (), a.rounds, target_s=0.02)
        r = _timing.ratio_stats(samples["ember_base"], samples["ember"])
        if dims is None:
            errs = [float((c[1] - x).abs().max()) for c in calls.values()]
        else:
            ref, scale = x.double().sum(dims), x.double().abs().sum(dims)
            errs = [float(((c[1].double() - ref).abs() / scale).max()) for c in calls.values()]
        print(f"{name:22s} {statistics.median(samples['ember_base']) * 1e3:8.3f} "
              f"{statistics.median(samples['ember']) * 1e3:8.3f}  {r['median']:5.2f} "
              f"[{r['p25']:.2f}-{r['p75']:.2f}]{'':14s}{errs[0]:.1e} / {errs[1]:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
