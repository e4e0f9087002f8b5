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
        return copy.deepcopy(init).train()

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

    # contenders: name -> (step fn, path); each starts from `init` and sees the same batches
    steps, paths, losses, times = {}, {}, {}, {}
    eager_step = make_step(fresh())
    t0 = time.perf_counter()
    losses["eager"], times["eager"] = [eager_step(0)], [time.perf_counter() - t0]
    steps["eager"], paths["eager"] = eager_step, compilers.Path("eager", "eager")

    def check(loss):
        diff = abs(loss - losses["eager"][0])
        return None if diff <= 1e-3 * max(1.0, abs(losses["eager"][0])) else f"wrong loss: |diff|={diff:.3g}"

    made: dict[int, object] = {}

    def first_call(compiled_model):
        made[id(compiled_model)] = make_step(compiled_model)
        return made[id(compiled_model)](0)

    contenders = [("ember", "ember")] + ([("torch", "torch")] if args.torch else [])
    for name, compiler in contenders:
        compiled_model, path, first_loss, first_s = compilers.first_working(
            compiler, fresh, first_call, check, backend=args.backend, front=args.front)
        steps[name], paths[name] = made[id(compiled_model)], path
        losses[name], times[name] = [first_loss], [first_s]

    names = list(steps)
    for i in range(1, args.steps):      # alternate the order every step: load hits all alike
        for name in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            loss = compilers.call_recording(paths[name], steps[name], i)
            times[name].append(time.perf_counter() - t0)
            losses[name].append(loss)

    _print_path(paths["ember"])
    if "torch" in paths:
        print(f"   torch column: {paths['torch'].label} (the peer, for reference)")
    print()
    print(f"   {'step':>4}" + "".join(f"{n:>13}" for n in names)
          + "".join(f"{n + ' loss':>13}" for n in names))
    for i in range(min(10, args.steps)):
        print(f"   {i + 1:>4}" + "".join(f" {_fmt_ms(times[n][i])}" for n in names)
              + "".join(f"{losses[n][i]:13.5f}" for n in names))
    skip = 2 if args.steps >= 12 else 1
    med = {n: statistics.median(times[n][skip:]) for n in names}
    count = len(times["eager"][skip:])
    print()
    print(f"   {'':<26}" + "".join(f"{n:>13}" for n in names))
    print(f"   {'first call (compile)':<26}" + "".join(f" {_fmt_ms(times[n][0])}" for n in names))
    print(f"   {f'steady step (median {count})':<26}" + "".join(f" {_fmt_ms(med[n])}" for n in names))
    print(f"   {'speedup vs eager':<26}" + "".join(f"{med['eager'] / med[n]:>12.2f}x" for n in names))
    print(f"   {'max |loss diff| vs eager':<26}" + "".join(
        f"{max(abs(a - b) for a, b in zip(losses['eager'], losses[n])):>13.2e}" for n in names))
    print(f"   {'|loss diff| at step 2':<26}" + "".join(
        f"{abs(losses['eager'][1] - losses[n][1]) if args.steps > 1 else 0.0:>13.2e}" for n in names))
    p = paths["ember"]
    print(f"   ember path: {p.label}"
          + ("" if p.compiled and not p.problem else "  (NOT compiled: the ember column is eager)"))
    return 0


def add_resnet18_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=20, help="training steps per compiler (>= 12)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="image side")
    p.add_argument("--torch", action="store_true",
                   help="add a torch.compile (inductor) column (its compile adds a minute or more)")


# ------------------------------------------------------------------------------------ cifar10
def add_cifar10_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet50", help="a torchvision.models constructor name")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--root", default=None,
                   help="CIFAR-10 root (torchvision layout); default: $CIFAR10_ROOT, ./data")
    p.add_argument("--samples", type=int, default=50000,
                   help="training samples (FakeData size, or a prefix of CIFAR-10); test = 1/5")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--plot", default="seed-cifar10.png", help="PNG of epoch times ('' = none)")


def _cifar10(root: str | None, samples: int):
    """(train, test, source) as in-memory tensors: real CIFAR-10 when on disk, else FakeData."""
    import os

    import torch
    import torchvision
    from torchvision import transforms

    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261))])
    n_test = max(samples // 5, 1)
    roots = [r for r in (root, os.environ.get("CIFAR10_ROOT"), "data", "~/data") if r]
    for r in roots:
        r = os.path.expanduser(r)
        try:
            train = torchvision.datasets.CIFAR10(r, train=True, download=False)
            test = torchvision.datasets.CIFAR10(r, train=False, download=False)
        except (RuntimeError, OSError):
            continue
        source = f"CIFAR-10 from {r}"
        break
    else:
        train = torchvision.datasets.FakeData(samples, (3, 32, 32), 10, random_offset=0)
        test = torchvision.datasets.FakeData(n_test, (3, 32, 32), 10, random_offset=10**6)
        source = "FakeData (CIFAR-10 not found on disk; random labels, so accuracy stays ~10%)"

    def materialize(ds, n):
        n = min(n, len(ds))
        xs, ys = zip(*(ds[i] for i in range(n)))
        return torch.stack([tf(x) for x in xs]), torch.tensor(ys)
    return materialize(train, samples), materialize(test, n_test), source


def seed_cifar10(args: argparse.Namespace) -> int:
    import torch
    import torchvision

    hygiene.apply_threads(args.threads)
    _header(f"seed-cifar10: {args.model} on CIFAR-10, {args.epochs} epochs, batch {args.batch}, "
            f"SGD lr {args.lr}")
    t0 = time.perf_counter()
    (xtr, ytr), (xte, yte), source = _cifar10(args.root, args.samples)
    print(f"   data: {source}; train {len(xtr)}, test {len(xte)} ({time.perf_counter() - t0:.1f} s "
          "to load)")
    torch.manual_seed(0)
    init = getattr(torchvision.models, args.model)(weights=None, num_classes=10)

    def fresh():
        return copy.deepcopy(init).train()

    def batches(epoch):
        g = torch.Generator().manual_seed(epoch)
        perm = torch.randperm(len(xtr), generator=g)
        for i in range(0, len(perm) - args.batch + 1, args.batch):   # full batches: one shape
            idx = perm[i:i + args.batch]
            yield xtr[idx], ytr[idx]

    def train_step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def run(model, label):
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
        rows = []
        for epoch in range(args.epochs):
            model.train()
            t = time.perf_counter()
            losses = []
            n_steps = len(xtr) // args.batch
            for x, y in batches(epoch):
                losses.append(train_step(model, opt, x, y))
                if epoch == 0 and len(losses) == 6 and n_steps > 30:
                    per = (time.perf_counter() - t) / 6
                    print(f"   {label:6} ~{per:.2f} s/step, {n_steps} steps/epoch: about "
                          f"{per * n_steps * args.epochs / 60:.0f} min for {args.epochs} epochs "
                          "(--samples makes it shorter)", flush=True)
            train_s = time.perf_counter() - t
            model.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, len(xte), 256):
                    correct += int((model(xte[i:i + 256]).argmax(1) == yte[i:i + 256]).sum())
            acc = correct / len(xte)
            rows.append((train_s, statistics.fmean(losses), acc))
            print(f"   {label:6} epoch {epoch + 1}: {train_s:8.1f} s  loss {rows[-1][1]:.4f}  "
                  f"test acc {100 * acc:5.1f}%", flush=True)
        return rows

    eager_rows = run(fresh(), "eager")

    # pick the path on a throwaway copy, then train a fresh copy through it from epoch 1
    x0, y0 = next(batches(0))
    _, probe, _, probe_s = compilers.first_working(
        "ember", fresh, lambda m: train_step(m, torch.optim.SGD(m.parameters(), lr=0.0), x0, y0),
        backend=args.backend, front=args.front)
    _print_path(probe)
    print(f"   (path probe took {probe_s:.1f} s; the run below compiles again from scratch)")
    compilers.reset_all()
    compiled, path = compilers.make(probe.front, probe.backend, fresh())
    ember_rows = compilers.call_recording(path, run, compiled, "ember")

    print()
    print(f"   {'epoch':>5} {'eager s':>9} {'ember s':>9} {'speedup':>8} {'eager acc':>10} "
          f"{'ember acc':>10} {'|loss diff|':>12}")
    for i, (e, c) in enumerate(zip(eager_rows, ember_rows)):
        print(f"   {i + 1:>5} {e[0]:9.1f} {c[0]:9.1f} {e[0] / c[0]:7.2f}x {100 * e[2]:9.1f}% "
              f"{100 * c[2]:9.1f}% {abs(e[1] - c[1]):12.2e}")
    tot_e, tot_c = sum(r[0] for r in eager_rows), sum(r[0] for r in ember_rows)
    print(f"   total {tot_e:9.1f} {tot_c:9.1f} {tot_e / tot_c:7.2f}x   (epoch 1 includes compile)")
    print(f"   path: {path.label}{'' if path.compiled else '  (NOT compiled: ember column is eager)'}")
    if args.plot:
        _plot_epochs(args.plot, args.model, eager_rows, ember_rows, path.label)
    return 0


def _plot_epochs(where: str, model: str, eager_rows, ember_rows, label: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("   plot skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return
    n = len(eager_rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(1, n + 1)
    ax.bar([x - 0.2 for x in xs], [r[0] for r in eager_rows], width=0.4, label="eager")
    ax.bar([x + 0.2 for x in xs], [r[0] for r in ember_rows], width=0.4, label=f"ember ({label})")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train seconds")
    ax.set_title(f"{model} on CIFAR-10: time per epoch (epoch 1 includes compile)")
    ax.set_xticks(list(xs))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(where, dpi=110)
    plt.close(fig)
    print(f"   plot written to {where}")
