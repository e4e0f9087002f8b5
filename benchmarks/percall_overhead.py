"""Per-call overhead of small compiled graphs (#23, design note 051): eager vs ember per call,
in thread CPU time (1 thread), and ember's call peeled layer by layer.

    python benchmarks/percall_overhead.py [--calls 2000] [--blocks 9] [--only REGEX] [--layers]

Cases: `add1` (x + 1 on 16 floats, a function), `chain3` (tanh(x * w + b), a module), `ebag`
(F.embedding_bag mean, 1000x16 table, 64 indices), `gn` (GroupNorm(4, 16) on 1x16x8x8),
each in modes
  frozen    no_grad, parameters not requiring grad (the graph is frozen)
  trained   no_grad, parameters requiring grad (the op sweep's infer rows: frozen as well)
  unfrozen  no_grad, options={"freeze": False}
  train     grad enabled, inputs and parameters requiring grad: forward only
with the speed check off (EMBER_SPEED_CHECK=0) and on. Eager and ember run in alternating
blocks of `--calls` calls; per-call microseconds are minima over blocks (noise only adds), with the median of
the paired per-block differences beside them. `--layers` times each layer of the compiled call alone (the module call,
the capture entry, the speed check's chooser, the frozen runtime, aot's runtime, the wrapper,
the wrapper's `call`): the difference between neighbours is that layer's own cost.
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import sys
import time

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.capture import entry as capture_entry  # noqa: E402


class Chain3(nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.tanh(x * self.w + self.b)


class EBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(1000, 16))

    def forward(self, i, o):
        return F.embedding_bag(i, self.w, o, mode="mean")


class GN(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 16)

    def forward(self, x):
        return self.gn(x)


def add1(x):
    return x + 1


CASES = {
    "add1": (lambda: add1, lambda: [torch.randn(16)]),
    "chain3": (Chain3, lambda: [torch.randn(16)]),
    "ebag": (EBag, lambda: [torch.randint(0, 1000, (64,)), torch.arange(0, 64, 8)]),
    "gn": (GN, lambda: [torch.randn(1, 16, 8, 8)]),
}
MODES = ("frozen", "trained", "unfrozen", "train")


def block(fn, args, n):
    t0 = time.thread_time()
    for _ in range(n):
        fn(*args)
    return (time.thread_time() - t0) / n * 1e6


def paired(fns: dict, args, calls, blocks) -> dict:
    """Per-call us of each fn, one block each per round, order reversed every other round."""
    names = list(fns)
    res = {k: [] for k in names}
    for r in range(blocks):
        for k in (names if r % 2 == 0 else names[::-1]):
            res[k].append(block(fns[k], args, calls))
    return res


def build(case, mode, check):
    os.environ["EMBER_SPEED_CHECK"] = "1" if check else "0"
    ember.reset()
    make, inputs = CASES[case]
    torch.manual_seed(0)
    base = make()
    args = inputs()
    if isinstance(base, nn.Module):
        base.requires_grad_(mode in ("trained", "train"))
        comp = ember.compile(copy.deepcopy(base),
                             options={"freeze": False} if mode == "unfrozen" else None)
    else:
        comp = ember.compile(base, options={"freeze": False} if mode == "unfrozen" else None)
    if mode == "train":
        args = [a.requires_grad_() if a.is_floating_point() else a for a in args]
    return base, comp, args


def grad_ctx(mode):
    return torch.enable_grad() if mode == "train" else torch.no_grad()


def layers(comp, args) -> dict:
    """Each layer of ember's call as a callable on the user's args (see the module docstring)."""
    out = {"module call": comp}
    entries = [e for c in capture_entry.CACHES.values() for e in c.entries if not e.eager]
    if len(entries) != 1:
        return out
    e = entries[0]
    mod = comp if isinstance(comp, nn.Module) else None
    if mod is not None:
        out["ModuleRunner"] = mod._compiled_call_impl._run
        out["Runner"] = mod._compiled_call_impl._run.runner
        out["capture entry"] = lambda *a: e.run(type(mod).forward, mod, *a)
    else:
        out["capture entry"] = lambda *a: e.run(add1, *a)
    c = e.run.__globals__["__compiled"]
    # the compiled graph's arguments: the entry's call expression, evaluated once here
    src = e.source
    m = re.search(r"__o = __compiled\((.*)\)\n", src)
    ns = dict(e.run.__globals__)
    loc = {f"L{i}": v for i, v in enumerate(([mod] if mod is not None else []) + list(args))}
    if "__s = " in src:
        e.run(type(mod).forward, mod, *args)
        key = re.search(r"__states.get\((.*)\)\n", src).group(1)
        loc["__s"] = ns["__states"].get(eval(key, ns, loc))
    gargs = eval(f"({m.group(1)},)", ns, loc)
    graph = lambda f: (lambda *a: f(*gargs))    # noqa: E731
    out["compiled (speed check)"] = graph(c)
    if getattr(c, "decided", False):        # the speed check's _Chooser, decided
        c = c.run
        out["chosen"] = graph(c)
    if hasattr(c, "main_args"):            # FrozenRuntime
        out["frozen runtime"] = graph(c)
        margs = c.main_args(gargs)
        c = c.main
        graph = lambda f: (lambda *a: f(*margs))   # noqa: E731
        out["aot runtime"] = graph(c)
    elif hasattr(c, "fw"):
        out["aot runtime"] = graph(c)
    fw = getattr(c, "fw", None)
    if fw is not None:
        out["wrapper (grad_free)"] = graph(fw)
        cell = [x.cell_contents for x in fw.boxed.__closure__ if callable(x.cell_contents)
                and getattr(x.cell_contents, "__name__", "") == "<lambda>"]
        if cell:
            compiled = [x.cell_contents for x in cell[0].__closure__][0]
            inner_args = margs if "margs" in dir() else gargs
            def call(*a, f=compiled, args=inner_args):
                with torch.no_grad():
                    return f.call(list(args))
            out["wrapper call() +no_grad"] = call
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--only", default="")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--checks", default="0,1")
    ap.add_argument("--layers", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}, 1 thread, thread CPU time, {a.calls} calls x "
          f"{a.blocks} blocks; load {os.getloadavg()[0]:.1f}")
    for case in CASES:
        if a.only and not re.search(a.only, case):
            continue
        for mode in a.modes.split(","):
            if case == "add1" and mode in ("frozen", "unfrozen", "trained"):
                if mode != "frozen":
                    continue            # no parameters: one inference row
            for check in map(int, a.checks.split(",")):
                base, comp, args = build(case, mode, check)
                with grad_ctx(mode):
                    for _ in range(12):     # past the first call and the speed check's timings
                        comp(*args)
                    fns = layers(comp, args) if a.layers else {"module call": comp}
                    res = paired({"eager": base, **fns}, args, a.calls, a.blocks)
                eag = min(res["eager"])
                row = [f"{case:7s} {mode:8s} check={check}: eager {eag:6.1f} us"]
                for k, v in res.items():
                    if k == "eager":
                        continue
                    d = [x - y for x, y in zip(v, res["eager"])]
                    row.append(f"{k} {min(v):6.1f} (+{min(v) - eag:.1f}; paired median "
                               f"+{statistics.median(d):.1f})")
                print(row[0] + "; " + row[1])
                for r in row[2:]:
                    print("      " + r)
                sys.stdout.flush()


if __name__ == "__main__":
    main()
