"""Convolution networks on CPU: eager, ember and torch.compile (Inductor) side by side (#24).

Inference (torch.no_grad(), model.eval()) is measured for ember twice: as users call it
(parameters require grad: channels-last oneDNN convs, not frozen) and frozen
(`options={"freeze": True}`: BatchNorm folded, constants computed once). Training is a whole
step (forward, backward, SGD). Callables are timed in alternating order each round
(benchmarks/_timing.paired), at a fixed thread count, allocator kept from returning memory to
the OS; ratios are eager time / other time: the ratio of the medians and the per-round spread.

    python benchmarks/convnets.py                         # the default set, inference
    python benchmarks/convnets.py --mode both --threads 2 --models resnet18,squeezenet1_1
    python benchmarks/convnets.py --models resnet50 --batch 8 --size 224 --rounds 7

Writes a table and benchmarks/results/convnets_<date>_<commit>.jsonl.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402

MODELS = ["resnet50", "resnet18", "mobilenet_v3_large", "squeezenet1_1", "shufflenet_v2_x1_0",
          "densenet121", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf"]


def build(name: str):
    import torch
    import torchvision
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(num_classes=100)


def infer_fns(name, x, args):
    import torch
    import ember
    base = build(name).eval()
    frozen = copy.deepcopy(base).requires_grad_(False)
    fns = {"eager": base,
           "ember": ember.compile(copy.deepcopy(base)),
           "ember_frozen": ember.compile(frozen, options={"freeze": True})}
    if args.inductor:
        fns["inductor"] = torch.compile(copy.deepcopy(base))

    def nograd(f):
        def run(x):
            with torch.no_grad():
                return f(x)
        return run
    return base, {k: nograd(f) for k, f in fns.items()}


def conv_act_per_weight(model, x) -> float:
    """Σ conv input elements / Σ conv weight elements: layout.py's training cost rule."""
    import torch
    acts, weights = [], []

    def hook(mod, inp):
        acts.append(inp[0].numel())
        weights.append(mod.weight.numel())
    handles = [m.register_forward_pre_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return sum(acts) / max(sum(weights), 1)


def train_fns(name, x, args):
    import torch
    import ember
    base = build(name).train()
    models = {"eager": base, "ember": ember.compile(copy.deepcopy(base))}
    if args.compare_layouts:
        for layout in ("channels_last", "contiguous"):
            models[f"ember_{layout}"] = ember.compile(copy.deepcopy(base),
                                                      options={"layout": layout})
    if args.inductor:
        models["inductor"] = torch.compile(copy.deepcopy(base))
    target = torch.randint(0, 100, (x.shape[0],))

    def step_of(m):
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)

        def step(x):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(m(x), target)
            loss.backward()
            opt.step()
            return loss
        return step
    return base, {k: step_of(m) for k, m in models.items()}


def measure(name, mode, args) -> dict:
    import torch
    x = torch.randn(args.batch, 3, args.size, args.size)
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    _, fns = (infer_fns if mode == "infer" else train_fns)(name, x, args)
    row = {"model": name, "mode": mode, "batch": args.batch, "size": args.size,
           "threads": torch.get_num_threads(), "channels_last_input": args.channels_last}
    if mode == "train":
        row["conv_act_per_weight"] = round(conv_act_per_weight(build(name), x), 2)
    if mode == "infer":
        with torch.no_grad():
            want = fns["eager"](x)
    for k, f in fns.items():                       # compile (cold caches) and warm up
        t0 = time.perf_counter()
        out = f(x)
        f(x)
        row[f"{k}_first_s"] = round(time.perf_counter() - t0, 2)
        if mode == "infer" and k != "eager":
            row[f"{k}_max_err"] = float((out - want).abs().max())
            row[f"{k}_strides_ok"] = out.stride() == want.stride()
    for _ in range(2):                             # the speed check decides on calls 2..3
        for f in fns.values():
            f(x)
    samples, reps = _timing.paired(fns, (x,), rounds=args.rounds, reps=1)
    row["eager_ms"] = round(statistics.median(samples["eager"]) * 1e3, 2)
    for k in fns:
        if k == "eager":
            continue
        st = _timing.ratio_stats(samples["eager"], samples[k])
        row[f"{k}_ms"] = round(statistics.median(samples[k]) * 1e3, 2)
        row[f"{k}_x"] = round(st["of_medians"], 3)
        row[f"{k}_spread"] = [round(st["min"], 3), round(st["max"], 3)]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--mode", choices=["infer", "train", "both"], default="infer")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--channels-last", action="store_true", help="feed channels_last inputs")
    p.add_argument("--no-inductor", dest="inductor", action="store_false")
    p.add_argument("--compare-layouts", action="store_true",
                   help="training: also ember forced channels-last and forced contiguous")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    _timing.prepare()
    import torch
    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=_timing.ROOT).stdout.strip()
    out = args.out or os.path.join(_timing.ROOT, "benchmarks", "results",
                                   f"convnets_{datetime.date.today()}_{commit}.jsonl")
    modes = ["infer", "train"] if args.mode == "both" else [args.mode]
    cols = ["ember", "ember_frozen", "inductor"] + (
        ["ember_channels_last", "ember_contiguous"] if args.compare_layouts else [])
    print(f"{'model':22s} {'mode':5s} {'eager ms':>9s} " +
          " ".join(f"{c + ' x (spread)':>24s}" for c in cols), flush=True)
    for name in args.models.split(","):
        for mode in modes:
            try:
                row = measure(name, mode, args)
            except Exception as exc:  # noqa: BLE001 - a failing model is a row, not the end
                row = {"model": name, "mode": mode, "error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:22s} {mode:5s} ERROR {row['error'][:200]}", flush=True)
            else:
                cells = [f"{row[c + '_x']:.2f} ({row[c + '_spread'][0]:.2f}-"
                         f"{row[c + '_spread'][1]:.2f})" if c + "_x" in row else "-"
                         for c in cols]
                print(f"{name:22s} {mode:5s} {row['eager_ms']:9.1f} " +
                      " ".join(f"{c:>24s}" for c in cells), flush=True)
            row["commit"] = commit
            with open(out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
