"""The seed's experiments: `ember bench seed-resnet18` and `ember bench seed-cifar10`.

seed-resnet18: the one-line-compile training loop. A torchvision ResNet18 (random weights), SGD,
random batches of 16x3x64x64; eager and `ember.compile(model)` start from the same weights and
see the same batches, steps alternate between them (ABAB, the order flipping each step) so load
from other processes hits both alike. Prints per-step times for the first steps, then first-call
(compile) time, steady step time (median), speedup and the largest loss difference.

seed-cifar10: ResNet-family training on CIFAR-10 (torchvision's CIFAR10 from a local root when
present, FakeData of the same shape and size otherwise) for N epochs, eager then ember; per-epoch
time and accuracy, and a PNG of epoch times.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

from . import compilers, hygiene


def _header(title: str) -> None:
    env = hygiene.describe()
    print(f"== {title}")
    print(f"   torch {env['torch']}, python {env['python']}, threads {env['threads']} "
          f"(OMP_NUM_THREADS={env['omp_num_threads']}), allocator {env['allocator']} "
          f"{' '.join(f'{k}={v}' for k, v in env['malloc_env'].items())}")
    print("   note: timings on a shared 2-core machine are noisy; medians of alternating steps")


def _print_path(path: compilers.Path) -> None:
    if path.rejected:
        print("   paths tried first (best first):")
        for line in path.rejected:
            print(f"     - {line[:200]}")
    state = "compiled" if path.compiled and not path.problem else "NOT TRUSTED: " + (
        path.problem or "nothing compiled")
    print(f"   ember numbers come from: {path.label}  [{state}; graphs={path.graphs}]")


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:9.1f} ms"


def seed_resnet18(args: argparse.Namespace) -> int:
    import torch
    import torchvision

    hygiene.apply_threads(args.threads)
    _header(f"seed-resnet18: ResNet18 training loop, batch {args.batch}, 3x{args.size}x{args.size}, "
            f"SGD, {args.steps} steps")
    torch.manual_seed(0)
    init = torchvision.models.resnet18(num_classes=10)
    batches = [(torch.randn(args.batch, 3, args.size, args.size),
                torch.randint(0, 10, (args.batch,))) for _ in range(4)]

    def fresh():
        model = copy.deepcopy(init).train()
        return model

    def make_step(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(i):
            x, y = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()
        return step

    eager_step = make_step(fresh())
    t0 = time.perf_counter()
    eager_losses = [eager_step(0)]
    eager_times = [time.perf_counter() - t0]

    def check(loss):
        diff = abs(loss - eager_losses[0])
        return None if diff <= 1e-3 * max(1.0, abs(eager_losses[0])) else f"wrong loss: |diff|={diff:.3g}"

    steps: dict[int, object] = {}

    def first_call(compiled_model):
        steps[id(compiled_model)] = make_step(compiled_model)
        return steps[id(compiled_model)](0)

    compiled_model, path, first_loss, first_s = compilers.first_working(
        "ember", fresh, first_call, check, backend=args.backend, front=args.front)
    comp_step = steps[id(compiled_model)]
    comp_losses, comp_times = [first_loss], [first_s]

    for i in range(1, args.steps):
        order = [("e", eager_step), ("c", comp_step)]
        if i % 2:
            order.reverse()
        for tag, step in order:
            t0 = time.perf_counter()
            loss = compilers.call_recording(path, step, i) if tag == "c" else step(i)
            dt = time.perf_counter() - t0
            (comp_losses if tag == "c" else eager_losses).append(loss)
            (comp_times if tag == "c" else eager_times).append(dt)

    _print_path(path)
    print()
    print(f"   {'step':>4} {'eager':>12} {'ember':>12} {'eager loss':>11} {'ember loss':>11}")
    for i in range(min(10, args.steps)):
        print(f"   {i + 1:>4} {_fmt_ms(eager_times[i])}  {_fmt_ms(comp_times[i])} "
              f"{eager_losses[i]:11.5f} {comp_losses[i]:11.5f}")
    skip = 2 if args.steps >= 12 else 1
    e_med = statistics.median(eager_times[skip:])
    c_med = statistics.median(comp_times[skip:])
    n = len(eager_times[skip:])
    loss_diff = max(abs(a - b) for a, b in zip(eager_losses, comp_losses))
    print()
    print(f"   {'':<24}{'eager':>12}{'ember':>14}")
    print(f"   {'first call (compile)':<24}{_fmt_ms(eager_times[0])}  {_fmt_ms(comp_times[0])}")
    print(f"   {f'steady step (median {n})':<24}{_fmt_ms(e_med)}  {_fmt_ms(c_med)}")
    print(f"   {'speedup vs eager':<24}{'1.00x':>12}{e_med / c_med:>13.2f}x")
    print(f"   {'max |loss diff|':<24}{'':>12}{loss_diff:>14.2e}")
    print(f"   path: {path.label}{'' if path.compiled else '  (NOT compiled: ember column is eager)'}")
    return 0


def add_resnet18_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=20, help="training steps per compiler (>= 12)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="image side")
