"""Peak CPU memory of one training step (forward + backward) of a stack of MLP blocks, with and
without torch.utils.checkpoint, eager vs ember (#28).

Peak = the highest running sum of the allocations and frees torch.profiler records
(profile_memory=True; each attributed to the innermost op, ops in start order) during the step,
above what was live before it (parameters, input, grads of earlier steps).
The compiled model is warmed up first, so compilation is not measured.

    .venv/bin/python benchmarks/checkpoint_memory.py [--d 256 --blocks 8 --tokens 2048]
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import ember


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.n = torch.nn.LayerNorm(d)
        self.l1 = torch.nn.Linear(d, 4 * d)
        self.l2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.l2(F.gelu(self.l1(self.n(x))))


class Net(torch.nn.Module):
    def __init__(self, d, n, ck):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.ck = ck

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ck else b(x)
        return x.square().mean()


def peak_bytes(step) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step()
    # each allocation/free is attributed once, to the innermost op (self_cpu_memory_usage)
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(d, n, tokens, ck, backend):
    torch.manual_seed(0)
    m = Net(d, n, ck)
    x = torch.randn(tokens, d, requires_grad=True)
    if backend != "eager":
        m = ember.compile(copy.deepcopy(m), backend=backend)
        for _ in range(2):
            m(x).backward()

    def step():
        m(x).backward()
    step()
    return min(peak_bytes(step) for _ in range(2))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--backends", default="eager,aot_eager,ember")
    a = ap.parse_args(argv)
    print(f"MLP blocks d={a.d} x{a.blocks}, {a.tokens} tokens, float32: peak MiB of fwd+bwd")
    print(f"{'backend':10} {'no ckpt':>9} {'ckpt':>9} {'saving':>7}")
    for be in a.backends.split(","):
        ember.reset()
        plain = measure(a.d, a.blocks, a.tokens, False, be) / 2**20
        ck = measure(a.d, a.blocks, a.tokens, True, be) / 2**20
        print(f"{be:10} {plain:9.1f} {ck:9.1f} {plain / ck:6.2f}x")


if __name__ == "__main__":
    main()
