"""Paired eager vs ember (vs torch.compile) timing of one training step of a small model, through
our own capture (`ember.compile`). Rounds alternate the order; each figure is a median.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
        python benchmarks/train_step.py --model transformer [--torch] [--rounds 9]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

import ember


def build(name):
    torch.manual_seed(0)
    if name == "transformer":
        return nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), torch.randn(8, 128, 256)
    if name == "mlp":
        return (nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.LayerNorm(1024), nn.Linear(1024, 1024),
                              nn.ReLU(), nn.Linear(1024, 10)), torch.randn(256, 512))
    raise ValueError(f"unknown model {name!r}; valid: transformer, mlp")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch", action="store_true", help="also time torch.compile (inductor)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, x = build(a.model)
    compiled = {"eager": model, "ember": ember.compile(build(a.model)[0])}
    if a.torch:
        compiled["torch"] = torch.compile(build(a.model)[0])

    def step(mod):
        mod(x).float().pow(2).mean().backward()
    for m in compiled.values():     # the first calls compile
        step(m)
        step(m)
    samples = {k: [] for k in compiled}
    for r in range(a.rounds):
        for k in (list(compiled) if r % 2 == 0 else list(compiled)[::-1]):
            t0 = time.perf_counter()
            for _ in range(a.reps):
                step(compiled[k])
            samples[k].append((time.perf_counter() - t0) / a.reps)
    med = {k: statistics.median(v) for k, v in samples.items()}
    for k, v in med.items():
        print(f"{a.model} train {k:6s} {v * 1e3:8.2f} ms  {med['eager'] / v:5.2f}x eager")


if __name__ == "__main__":
    main()
