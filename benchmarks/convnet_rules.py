"""A/B of the #24 inference rules on one convnet, in one process (docs/design/024).

The model is captured once; its graph is compiled by the ember backend once per variant, each
under its own set of rules (the old rule swapped in for the variant's compile only), then all
variants and eager run in paired alternating rounds timed with `time.thread_time` (CPU time of
this thread: at 1 thread it is what the model costs, and it moves less than wall time when
other processes load the machine). Speed check off. Prints medians and the per-round range of
eager time / variant time.

    python benchmarks/convnet_rules.py --model resnet50 --batch 8 --rounds 11 \\
        --variants before,after,frozen_before,frozen_after,inductor

Variants: after (this branch), before (per-call fold only where output >= weight, folded
weights NCHW, no residual fusion), no_residual, residual_all (no FUSE_ADD_MAX_REDUCTION),
clweights_only (old fold rule, channels-last folded weights), frozen_after, frozen_cl (frozen,
channels-last weights, not packed), frozen_before (plus the old written_inputs walk and the
before rules), inductor (torch.compile).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402

_timing.prepare()

import torch  # noqa: E402
import torch.fx as fx  # noqa: E402

import ember  # noqa: E402
from ember.backends import freeze, layout  # noqa: E402
from ember.backends.ember import ember_backend  # noqa: E402


def _old_fold_pays(conv, out, w):
    return isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor) and \
        w.dtype == torch.float32 and out.numel() >= w.numel()


def _old_written_inputs(gm):
    """Before: every input behind an in-place write counted as written."""
    out = set()
    for n in gm.graph.nodes:
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if n.op in ("call_function", "call_method") and n.args and \
                isinstance(n.args[0], fx.Node) and \
                ((name.endswith("_") and not name.endswith("__")) or
                 n.kwargs.get("inplace") is True):
            todo, seen = [n.args[0]], set()
            while todo:
                a = todo.pop()
                if a.op == "placeholder":
                    out.add(a)
                seen.add(a)
                todo.extend(i for i in a.all_input_nodes if i not in seen)
    return out


BEFORE = {(freeze, "fold_pays"): _old_fold_pays, (layout, "_computed"): lambda w: False,
          (layout, "_fuse_residual_adds"): lambda g, e: 0}
VARIANTS = {  # name -> (rules swapped in while compiling, frozen)
    "after": ({}, False),
    "before": (BEFORE, False),
    "no_residual": ({(layout, "_fuse_residual_adds"): lambda g, e: 0}, False),
    "residual_all": ({(layout, "FUSE_ADD_MAX_REDUCTION"): 1 << 30}, False),
    "clweights_only": ({(freeze, "fold_pays"): _old_fold_pays}, False),
    "frozen_after": ({}, True),
    "frozen_cl": ({(layout, "PACK_CONV_WEIGHTS"): False}, True),
    "frozen_before": ({**BEFORE, (freeze, "written_inputs"): _old_written_inputs,
                       (layout, "PACK_CONV_WEIGHTS"): False}, True),
}


def build(name):
    import timm
    import torchvision
    torch.manual_seed(0)
    if hasattr(torchvision.models, name):
        return getattr(torchvision.models, name)().eval()
    return timm.create_model(name).eval()


def capture(model, x):
    got = {}

    def backend(gm, example_inputs):
        got["gm"], got["ex"] = gm, list(example_inputs)
        return gm.forward
    with torch.no_grad():
        ember.compile(model, backend=backend)(x)
    return got["gm"], got["ex"]


def compiled(gm, ex, rules):
    old = {k: getattr(*k) for k in rules}
    for (mod, attr), val in rules.items():
        setattr(mod, attr, val)
    try:
        with torch.no_grad():
            fn = ember_backend(gm, ex)
            fn(*ex)
    finally:
        for (mod, attr), val in old.items():
            setattr(mod, attr, val)
    return lambda x: fn(*ex[:-1], x)[0]          # the image is the last placeholder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="before,after")
    args = ap.parse_args()
    os.environ["EMBER_SPEED_CHECK"] = "0"
    torch.set_num_threads(args.threads)
    base = build(args.model)
    x = torch.randn(args.batch, 3, args.size, args.size)
    fns, graphs = {"eager": base}, {}
    for v in args.variants.split(","):
        if v == "inductor":
            fns[v] = torch.compile(copy.deepcopy(base))
            continue
        rules, frozen = VARIANTS[v]
        if frozen not in graphs:
            graphs[frozen] = capture(copy.deepcopy(base).requires_grad_(not frozen), x)
        fns[v] = compiled(*graphs[frozen], rules)
    with torch.no_grad():
        ref = base(x)
        for k, f in fns.items():
            f(x)
            y = f(x)
            print(f"{k:14s} max |err| {(y - ref).abs().max().item():.2e}, strides as eager: "
                  f"{y.stride() == ref.stride()}")
        samples = {k: [] for k in fns}
        order = list(fns)
        for r in range(args.rounds):
            for k in (order if r % 2 == 0 else order[::-1]):
                t = time.thread_time()
                fns[k](x)
                samples[k].append(time.thread_time() - t)
    print(f"{args.model} batch {args.batch} {args.size}x{args.size}, {args.threads} thread(s), "
          f"{args.rounds} rounds, CPU time, load average {os.getloadavg()[0]:.1f}")
    for k, v in samples.items():
        r = _timing.ratio_stats(samples["eager"], v)
        print(f"{k:14s} median {statistics.median(v) * 1e3:7.1f} ms   vs eager "
              f"{r['of_medians']:.3f} [{r['min']:.3f}, {r['max']:.3f}]")


if __name__ == "__main__":
    main()
