"""Memory of frozen inference (#24): does freezing hold a second copy of the model?

Each (model, variant) runs in a fresh process: build the model (random weights) and its input,
read the resident set size (VmRSS), run three inference calls, and report how far the process
grew over that baseline: at its peak (`ru_maxrss`) and at the end (constants still held). The
variants are eager, ember as users call it (parameters require grad: not frozen) and ember
frozen (`requires_grad_(False)` under `torch.no_grad()`), so the frozen column minus the ember
column is what the folded constants and the constant graph cost. RSS also counts the compiler's
own Python objects and the loaded kernels, which is why ember's column is not zero; glibc's
default allocator returns large freed blocks to the OS, so the end figure is what stays live.

    python benchmarks/freeze_memory.py                          # resnet50, vit_b_16, bert-base
    python benchmarks/freeze_memory.py --models resnet50 --batch 8

Writes a table and benchmarks/results/freeze_memory_<date>_<commit>.jsonl.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["resnet50", "vit_b_16", "bert_base"]
VARIANTS = ["eager", "ember", "ember_frozen"]


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build(name: str, batch: int):
    import torch
    torch.manual_seed(0)
    if name == "bert_base":
        from transformers import BertConfig, BertModel
        model = BertModel(BertConfig()).eval()
        return model, (torch.randint(0, 30000, (batch, 128)),)
    import torchvision
    return getattr(torchvision.models, name)().eval(), (torch.randn(batch, 3, 224, 224),)


def child(name: str, variant: str, batch: int) -> dict:
    import gc

    import torch
    sys.path.insert(0, ROOT)
    import ember
    torch.set_num_threads(1)
    model, args = build(name, batch)
    state = sum(t.numel() * t.element_size() for t in
                [*model.parameters(), *model.buffers()]) / 2**20
    if variant == "ember_frozen":
        model.requires_grad_(False)
    fn = model if variant == "eager" else ember.compile(model)
    gc.collect()
    base = _rss_mib()
    with torch.no_grad():
        for _ in range(3):
            fn(*args)
    gc.collect()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    counts = ember.stats()["counts"]
    return {"model": name, "variant": variant, "batch": batch, "state_mib": round(state, 1),
            "base_mib": round(base, 1), "peak_over_base_mib": round(peak - base, 1),
            "end_over_base_mib": round(_rss_mib() - base, 1),
            "frozen_graphs": counts.get("frozen_graphs", 0)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.batch)))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    out = args.out or os.path.join(ROOT, "benchmarks", "results",
                                   f"freeze_memory_{datetime.date.today()}_{commit}.jsonl")
    print(f"{'model':12s} {'variant':13s} {'state MiB':>9s} {'peak+ MiB':>10s} {'end+ MiB':>9s} "
          f"frozen", flush=True)
    for name in args.models.split(","):
        for variant in VARIANTS:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name,
                                   variant, "--batch", str(args.batch)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{name:12s} {variant:13s} ERROR {proc.stderr[-300:]}", flush=True)
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["commit"] = commit
            print(f"{name:12s} {variant:13s} {row['state_mib']:9.1f} "
                  f"{row['peak_over_base_mib']:10.1f} {row['end_over_base_mib']:9.1f} "
                  f"{row['frozen_graphs']}", flush=True)
            with open(out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
