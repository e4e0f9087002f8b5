"""Per-call overhead of ember.compile(f, backend="eager") vs calling f directly, next to
torch.compile(f, backend="eager"), for a 1-op function and resnet18 forward.

    .venv/bin/python benchmarks/capture_overhead.py [--calls N]

Overhead = median(compiled call) - median(direct call), in µs, medians over many calls
(interleaved blocks so machine noise hits both sides alike).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import ember


def _median_us(fn, args, calls: int, block: int = 200) -> float:
    times = []
    for _ in range(max(1, calls // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            fn(*args)
        times.append((time.perf_counter() - t0) / block * 1e6)
    return statistics.median(times)


def measure(name, f, args, calls):
    for _ in range(3):
        f(*args)
    ef = ember.compile(f, backend="eager")
    tf = torch.compile(f, backend="eager")
    for _ in range(3):
        ef(*args)
        tf(*args)
    rows = {"direct": [], "ember": [], "torch.compile": []}
    for _ in range(5):           # ABAB: interleave the three
        rows["direct"].append(_median_us(f, args, calls // 5))
        rows["ember"].append(_median_us(ef, args, calls // 5))
        rows["torch.compile"].append(_median_us(tf, args, calls // 5))
    base = statistics.median(rows["direct"])
    e = statistics.median(rows["ember"]) - base
    t = statistics.median(rows["torch.compile"]) - base
    # dispatch only: a backend whose callable returns the first call's outputs, so what is timed
    # is argument binding + guards + fetching inputs + rebuilding outputs (no graph execution)
    ef_d = ember.compile(f, backend=_replay_backend)
    tf_d = torch.compile(f, backend=_replay_backend)
    for _ in range(3):
        ef_d(*args)
        tf_d(*args)
    ed = statistics.median(_median_us(ef_d, args, 2000) for _ in range(5))
    td = statistics.median(_median_us(tf_d, args, 2000) for _ in range(5))
    print(f"{name:<18} direct {base:9.2f} us | overhead: ember +{e:7.2f} us, torch.compile "
          f"+{t:7.2f} us | dispatch only: ember {ed:6.2f} us, torch.compile {td:6.2f} us")
    return e, t


def _replay_backend(gm, example_inputs):
    memo = []

    def run(*args):
        if not memo:
            memo.append(gm(*args))
        return memo[0]
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--resnet-calls", type=int, default=1000)
    a = p.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(8)

    def one_op(t):
        return t + 1

    print("per-call overhead over calling f directly (median of many calls)")
    measure("1-op function", one_op, (x,), a.calls)
    try:
        import torchvision
    except ImportError:
        return
    m = torchvision.models.resnet18().eval()
    img = torch.randn(1, 3, 32, 32)

    def resnet_fwd(t):
        return m(t)
    with torch.no_grad():
        measure("resnet18 forward", resnet_fwd, (img,), a.resnet_calls)


if __name__ == "__main__":
    main()
