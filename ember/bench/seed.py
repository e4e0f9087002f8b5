"""The seed's experiments: `ember bench seed-resnet18` (`make demo`) and `ember bench seed-cifar10`.

seed-resnet18: the one-line-compile training loop, side by side in three columns: eager,
`ember.compile(model)` and `torch.compile(model)` (Inductor, the peer; `--no-torch` drops it).
A torchvision ResNet18 (random weights), SGD, random batches of 16x3x64x64; then a second table
on a GPT-2 training loop (transformers' GPT2LMHeadModel from a small config, random weights,
nothing downloaded), where LayerNorm/GELU/softmax/residual adds leave fusion something to win.
Every column starts from the same weights and sees the same batches; ember's and Inductor's disk
caches start empty, so each first call is a cold compile; after it, steps alternate between the
columns (the order flipping each step) so load from other processes hits all alike. Per column:
first call, steady step (median), speedup vs eager and the loss at step 2 (the correctness
signal: later losses drift apart for every compiler alike). One summary line ends the output:
ember's cold compile against Inductor's, and the speedups.

seed-cifar10: ResNet-family training on CIFAR-10 (torchvision's CIFAR10 from a local root when
present, FakeData of the same shape and size otherwise) for N epochs, eager then ember; per-epoch
time and accuracy, and a PNG of epoch times.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from typing import Callable, Sequence

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


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 100 else f"{seconds:.0f} s"


# ------------------------------------------------------------------------------ training loops
COLUMNS = ("eager", "ember", "torch")
LOSS_RTOL = 1e-3      # step-2 loss further than this (relative) from eager's is flagged


@dataclasses.dataclass
class LoopResult:
    """One training loop run side by side: per column, step times and losses (step 1 = compile)."""

    title: str
    names: list[str]
    times: dict[str, list[float]]
    losses: dict[str, list[float]]
    paths: dict[str, compilers.Path]

    @property
    def skip(self) -> int:
        """Steps left out of the steady median: the first call, and the second on long runs."""
        return 2 if len(self.times["eager"]) >= 12 else 1

    def first(self, name: str) -> float:
        return self.times[name][0]

    def steady(self, name: str) -> float:
        return statistics.median(self.times[name][self.skip:] or self.times[name])

    def speedup(self, name: str) -> float:
        """Median over steps of eager's time / this column's: each step's pair ran back to back,
        so a burst of load from other processes shifts both sides of a ratio alike."""
        pairs = list(zip(self.times["eager"], self.times[name]))[self.skip:] or [
            (self.steady("eager"), self.steady(name))]
        return statistics.median(e / c for e, c in pairs)

    def loss_at(self, name: str, step: int = 2) -> float:
        return self.losses[name][min(step, len(self.losses[name])) - 1]

    def loss_ok(self, name: str) -> bool:
        ref = self.loss_at("eager")
        return abs(self.loss_at(name) - ref) <= LOSS_RTOL * max(1.0, abs(ref))


def run_loop(title: str, fresh: Callable, make_step: Callable, steps: int,
             names: Sequence[str] = COLUMNS, backend: str = "ember", front: str = "auto"
             ) -> LoopResult:
    """Train `fresh()` copies side by side, one per column, for `steps` steps each.

    `make_step(model)` returns `step(i) -> float loss`, with its own optimizer; every column
    starts from the same weights and sees the same batches. The first call of each compiled
    column is its compile (in-memory caches are reset first); after that the steps alternate
    between columns, the order flipping every step, so load from other processes hits all alike.
    """
    unknown = [n for n in names if n not in COLUMNS]
    if unknown or "eager" not in names:
        raise ValueError(f"columns must include 'eager' and come from {', '.join(COLUMNS)}; "
                         f"got {list(names)}")
    steps = max(int(steps), 2)
    times: dict[str, list[float]] = {}
    losses: dict[str, list[float]] = {}
    paths: dict[str, compilers.Path] = {}
    step_of: dict[str, Callable] = {}

    eager_step = make_step(fresh())
    t0 = time.perf_counter()
    losses["eager"], times["eager"] = [eager_step(0)], [time.perf_counter() - t0]
    step_of["eager"], paths["eager"] = eager_step, compilers.Path("eager", "eager")

    def check(loss):
        ref = losses["eager"][0]
        diff = abs(loss - ref)
        return None if diff <= LOSS_RTOL * max(1.0, abs(ref)) else f"wrong loss: |diff|={diff:.3g}"

    made: dict[int, Callable] = {}

    def first_call(compiled_model):
        made[id(compiled_model)] = make_step(compiled_model)
        return made[id(compiled_model)](0)

    # no compiled code of an earlier loop left (ember's and Dynamo's in-memory caches); not
    # between columns: ember.reset() would drop the ember column's graphs before its step 2
    compilers.reset_all()
    for name in names:
        if name == "eager":
            continue
        compiled_model, path, first_loss, first_s = compilers.first_working(
            name, fresh, first_call, check, backend=backend, front=front)
        step_of[name], paths[name] = made[id(compiled_model)], path
        losses[name], times[name] = [first_loss], [first_s]

    order = list(step_of)
    for i in range(1, steps):
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            loss = compilers.call_recording(paths[name], step_of[name], i)
            times[name].append(time.perf_counter() - t0)
            losses[name].append(loss)
    return LoopResult(title, order, times, losses, paths)


def format_loop(r: LoopResult, show_steps: int = 3) -> list[str]:
    """The per-step head and the table of one loop, as lines."""
    names = r.names
    lines = []
    for name in names:
        if name == "ember":
            p = r.paths[name]
            state = "compiled" if p.compiled and not p.problem else "NOT TRUSTED: " + (
                p.problem or "nothing compiled")
            lines.append(f"   ember column: {p.label}  [{state}; graphs={p.graphs}]")
            lines.extend(f"     (tried first: {line[:200]})" for line in p.rejected)
        elif name == "torch":
            lines.append(f"   torch column: {r.paths[name].label} (the peer)")
    lines.append("")
    lines.append(f"   {'step':>4}" + "".join(f"{n:>13}" for n in names)
                 + "".join(f"{n + ' loss':>13}" for n in names))
    for i in range(min(show_steps, len(r.times["eager"]))):
        lines.append(f"   {i + 1:>4}" + "".join(f" {_fmt_ms(r.times[n][i])}" for n in names)
                     + "".join(f"{r.losses[n][i]:13.5f}" for n in names))
    if len(r.times["eager"]) > show_steps:
        lines.append("      ...")
    count = len(r.times["eager"][r.skip:])
    lines.append("")
    lines.append(f"   {'':<26}" + "".join(f"{n:>13}" for n in names))
    lines.append(f"   {'first call (compile)':<26}"
                 + "".join(f" {_fmt_ms(r.first(n))}" for n in names))
    lines.append(f"   {f'steady step (median {count})':<26}"
                 + "".join(f" {_fmt_ms(r.steady(n))}" for n in names))
    lines.append(f"   {'speedup vs eager (paired)':<26}"
                 + "".join(f"{r.speedup(n):>12.2f}x" for n in names))
    lines.append(f"   {'loss at step 2':<26}" + "".join(
        f"{r.loss_at(n):>13.5f}" if r.loss_ok(n) else f"{r.loss_at(n):>12.5f}!" for n in names))
    off = [n for n in names if not r.loss_ok(n)]
    if off:
        lines.append(f"   ! step-2 loss of {', '.join(off)} is more than {LOSS_RTOL:g} (relative) "
                     "off eager's: a bug at the default sizes (a batch of 2 makes BatchNorm "
                     "chaotic from step 2)")
    return lines


def summary_line(results: Sequence[LoopResult], labels: Sequence[str]) -> str:
    """One line: cold compile (first calls, summed over the loops), then speedups per loop."""
    have = [n for n in ("ember", "torch") if all(n in r.names for r in results)]
    parts = []
    if have:
        first = {n: sum(r.first(n) for r in results) for n in have}
        if len(have) == 2:
            parts.append(f"cold compile (first calls): ember {_fmt_s(first['ember'])} vs "
                         f"torch.compile {_fmt_s(first['torch'])} "
                         f"({first['torch'] / first['ember']:.1f}x faster)")
        else:
            parts.append(f"cold compile (first calls): {have[0]} {_fmt_s(first[have[0]])}")
    speed = []
    for r, label in zip(results, labels):
        text = f"{label} " + (f"{r.speedup('ember'):.2f}x" if "ember" in r.names else "-")
        if "torch" in r.names:
            text += f" (torch.compile {r.speedup('torch'):.2f}x)"
        speed.append(text)
    parts.append("steady-step speedup vs eager: " + ", ".join(speed))
    return "; ".join(parts)


DRIFT_NOTE = ("   Losses agree at step 1-2, then drift apart for every compiler alike: SGD with "
              "momentum on a few memorized\n   random-label batches amplifies float rounding, so "
              "the loss at step 2 is the correctness signal\n   (tests/models compare grads and "
              "parameters step by step).")


# ----------------------------------------------------------------------------- seed-resnet18
def _resnet18_loop(args, names) -> LoopResult:
    import torch
    import torchvision

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

    return run_loop("resnet18", fresh, make_step, args.steps, names, args.backend, args.front)


def gpt2_config(args):
    import transformers
    return transformers.GPT2Config(
        vocab_size=args.gpt2_vocab, n_positions=args.gpt2_seq, n_embd=args.gpt2_embd,
        n_layer=args.gpt2_layers, n_head=args.gpt2_heads, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)


def _gpt2_loop(args, names) -> LoopResult:
    import torch
    import transformers

    torch.manual_seed(0)
    init = transformers.GPT2LMHeadModel(gpt2_config(args))
    init.loss_type = "ForCausalLM"   # what it falls back to anyway, without a warning on stderr
    batches = [torch.randint(0, args.gpt2_vocab, (args.gpt2_batch, args.gpt2_seq))
               for _ in range(4)]

    def fresh():
        return copy.deepcopy(init).train()

    def make_step(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(i):
            x = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            return loss.item()
        return step

    return run_loop("gpt2", fresh, make_step, args.gpt2_steps, names, args.backend, args.front)


def _cold_caches() -> str:
    """Point ember's and Inductor's disk caches at a fresh temp dir, so first calls are cold."""
    import atexit
    import os
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="ember-demo-")
    os.environ["EMBER_CACHE_DIR"] = os.path.join(root, "ember")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def seed_resnet18(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    hygiene.apply_threads(args.threads)
    names = ["eager", "ember"] + ([] if args.no_torch else ["torch"])
    if not args.warm_cache:
        _cold_caches()
    _header(f"seed-resnet18: ResNet18 training loop, batch {args.batch}, "
            f"3x{args.size}x{args.size}, SGD, {args.steps} steps; columns: {', '.join(names)}")
    print("   first calls are cold: " + ("disk caches as they are (--warm-cache)" if args.warm_cache
                                         else "ember's and Inductor's disk caches start empty"))
    slow = "" if args.no_torch else " (Inductor's cold compile takes a minute or more on 2 cores)"
    print(f"   running {', '.join(names)}{slow} ...", flush=True)
    results, labels = [], []
    r = _resnet18_loop(args, names)
    results.append(r)
    labels.append("resnet18")
    for line in format_loop(r):
        print(line)
    print(DRIFT_NOTE)
    if args.gpt2_steps > 0:
        print()
        print("== GPT-2 training loop (transformers GPT2LMHeadModel from a config, random "
              f"weights): {args.gpt2_layers} layers, d={args.gpt2_embd}, {args.gpt2_heads} heads, "
              f"vocab {args.gpt2_vocab}, batch {args.gpt2_batch}x{args.gpt2_seq} tokens, SGD, "
              f"{args.gpt2_steps} steps")
        print("   at this width LayerNorm, GELU, softmax and the residual adds weigh next to the "
              "matmuls: the ops fusion merges")
        print(f"   running {', '.join(names)}{slow} ...", flush=True)
        r = _gpt2_loop(args, names)
        results.append(r)
        labels.append("gpt2")
        for line in format_loop(r):
            print(line)
    print()
    print(summary_line(results, labels))
    bad = [f"{label}: {n}" for r, label in zip(results, labels) for n in r.names
           if n == "ember" and not (r.paths[n].compiled and not r.paths[n].problem)]
    if bad:
        print(f"   (NOT compiled, so that ember column ran eagerly: {', '.join(bad)})")
    print(f"   ({time.perf_counter() - t_start:.0f} s in all)")
    return 0


def add_resnet18_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=15,
                   help="ResNet18 training steps per column (>= 12 leaves the first two out of "
                        "the median)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="image side")
    p.add_argument("--no-torch", action="store_true",
                   help="skip the torch.compile (Inductor) column: its cold compiles take about "
                        "two minutes of the demo's time on 2 cores")
    p.add_argument("--torch", action="store_true",
                   help="the torch.compile column (on by default now; kept so old command lines "
                        "work)")
    p.add_argument("--warm-cache", action="store_true",
                   help="keep ember's and Inductor's disk caches (default: fresh empty ones, so "
                        "first calls are cold compiles)")
    g = p.add_argument_group("GPT-2 loop (the second table)")
    g.add_argument("--gpt2-steps", type=int, default=16, help="0 skips the GPT-2 table")
    g.add_argument("--gpt2-layers", type=int, default=2)
    g.add_argument("--gpt2-embd", type=int, default=256)
    g.add_argument("--gpt2-heads", type=int, default=4)
    g.add_argument("--gpt2-vocab", type=int, default=2048)
    g.add_argument("--gpt2-seq", type=int, default=256)
    g.add_argument("--gpt2-batch", type=int, default=4)


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
