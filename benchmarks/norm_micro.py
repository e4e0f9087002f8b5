"""Eager vs ember on one normalization layer, paired alternating rounds in one process.

    python benchmarks/norm_micro.py bn_train_fwd [--shape 8,144,56,56] [--rounds 21]
    python benchmarks/norm_micro.py ln_train [--shape 8,512,768] [--rounds 15]

bn_train_fwd: BatchNorm2d(C) in training mode under no_grad on a channels-last input (the
statistics kernel and the normalization; 035). ln_train: LayerNorm(D) forward + backward.
1 thread; CPU time per call (`time.thread_time`), medians; prints eager/ember (> 1: ember faster).
Run it from each tree to compare (eager's own time moves between processes: compare ratios).
"""
import argparse
import copy
import statistics
import time

import _timing

_timing.prepare()

import torch  # noqa: E402

import ember  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["bn_train_fwd", "ln_train"])
    ap.add_argument("--shape", default=None)
    ap.add_argument("--rounds", type=int, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if a.case == "bn_train_fwd":
        shape = [int(v) for v in (a.shape or "8,144,56,56").split(",")]
        m = torch.nn.BatchNorm2d(shape[1])
        x = (torch.randn(*shape) * 3 + 1).to(memory_format=torch.channels_last)

        def step(fn):
            with torch.no_grad():
                fn(x)
    else:
        shape = [int(v) for v in (a.shape or "8,512,768").split(",")]
        m = torch.nn.LayerNorm(shape[-1])
        x = torch.randn(*shape, requires_grad=True)
        g = torch.randn(*shape)

        def step(fn):
            fn(x).backward(g)
    f = ember.compile(copy.deepcopy(m))
    step(f), step(f)
    ts = {"eager": [], "ember": []}
    for r in range(a.rounds or (21 if a.case == "bn_train_fwd" else 15)):
        order = (("eager", m), ("ember", f)) if r % 2 == 0 else (("ember", f), ("eager", m))
        for name, fn in order:
            t = time.thread_time()
            step(fn)
            ts[name].append(time.thread_time() - t)
    e, c = statistics.median(ts["eager"]), statistics.median(ts["ember"])
    print(f"{a.case} {'x'.join(map(str, shape))}: eager {e * 1e3:.2f} ms, ember {c * 1e3:.2f} ms, "
          f"eager/ember {e / c:.2f}")


if __name__ == "__main__":
    main()
