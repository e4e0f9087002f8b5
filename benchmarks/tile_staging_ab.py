"""A/B of the staged transposed loads of tiled layout conversions (design 080), paired in one
process: the base ember compiles with cpp.py's `staged_tile_loads` answering no load (main's
kernels: loads read in place, tile loops in main's order), the new one as shipped. Thread CPU
time, 1 thread, alternating order; medians and the per-round ratios' median and range.

- a bench model, training steps of eager / base / new (bench Runner: forward, loss,
  backward, SGD):
      EMBER_SPEED_CHECK=0 EMBER_BACKEND_CACHE=0 PYTHONPATH=. python benchmarks/tile_staging_ab.py b_hf_deberta_v2 --rounds 9
- `--micro`: layout conversions (NCHW <-> NHWC, transposes, DeBERTa's head sum) eager / base /
  new:
      EMBER_SPEED_CHECK=0 EMBER_BACKEND_CACHE=0 PYTHONPATH=. python benchmarks/tile_staging_ab.py --micro --rounds 9
"""
import argparse
import copy
import os
import statistics as st
import types

import _timing


def micro_cases(torch):
    def head_sum(x):    # a bmm output [4 * 8, 64, 512] summed over 4 copies, stored [512, 8, 64]
        return x.view(4, 8, 64, 512).sum(0).permute(2, 0, 1).contiguous()

    def to_cl(x):
        return x.contiguous(memory_format=torch.channels_last)

    def to_nchw(x):
        return x.contiguous()

    def tcont(x):
        return x.transpose(-1, -2).contiguous()
    yield "head_sum", head_sum, (torch.randn(32, 64, 512),)
    for s in [(8, 128, 28, 28), (8, 256, 28, 28), (8, 144, 56, 56), (4, 96, 55, 55)]:
        x = torch.randn(*s)
        yield "cl_" + "x".join(map(str, s)), to_cl, (x,)
        yield "nchw_" + "x".join(map(str, s)), to_nchw, (to_cl(x),)
    yield "tcont_4x512x512", tcont, (torch.randn(4, 512, 512),)
    yield "tcont_3x1000x37", tcont, (torch.randn(3, 1000, 37),)
    yield "tcont_6x197x768", tcont, (torch.randn(6, 197, 768),)
    yield "tadd_4x768x512", lambda x, y: x.transpose(1, 2) + y, (torch.randn(4, 768, 512),
                                                                 torch.randn(4, 512, 768))


def report(name, s) -> str:
    """Medians (ms) of eager / base / new and the per-round ratios' median [min, max]."""
    line = " ".join(f"{k} {st.median(v) * 1e3:.3f}" for k, v in s.items())
    for x, y in [("eager", "base"), ("eager", "new"), ("base", "new")]:
        r = _timing.ratio_stats(s[x], s[y])
        line += f"  {x}/{y} {r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]"
    return f"{name:18} {line}"


def main():
    _timing.prepare()
    import torch
    import ember
    from ember.codegen import cpp
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    staged = cpp.staged_tile_loads

    def compiled(name, make, warm):
        """make() under the base codegen or the new one, run by warm() (it compiles then), with
        a cache dir of its own (the graph cache's key does not hold the codegen: the second
        variant would load the first one's kernels)."""
        cpp.staged_tile_loads = (lambda *_: []) if name == "base" else staged
        root = os.environ["EMBER_CACHE_DIR"]
        os.environ["EMBER_CACHE_DIR"] = os.path.join(root, name)
        try:
            f = make()
            warm(f)
            return f
        finally:
            cpp.staged_tile_loads = staged
            os.environ["EMBER_CACHE_DIR"] = root

    if a.micro:
        print(f"load {os.getloadavg()[0]:.1f}; ms per call (median); per-round ratios median [min, max]")
        for name, fn, inp in micro_cases(torch):
            fns = {"eager": fn}
            for k in ("base", "new"):
                # a function of its own code object: ember caches compiles per code object
                own = types.FunctionType(fn.__code__.replace(co_name=f"{k}_{name}"),
                                         fn.__globals__, closure=fn.__closure__)
                fns[k] = compiled(k, lambda: ember.compile(own, dynamic=False),
                                  lambda f: torch.testing.assert_close(f(*inp), fn(*inp)))
            s, _ = _timing.paired(fns, inp, rounds=a.rounds)
            print(report(name, s), flush=True)
        return

    from ember.bench import suites  # noqa: F401 - registers the models
    from ember.bench.harness import Runner
    from ember.bench.spec import REGISTRY
    spec = REGISTRY[a.model]
    torch.manual_seed(0)
    m = spec.build()
    m.train(True)
    args, kw = spec.inputs(), spec.kwargs()
    runners = {}
    for name in ("eager", "base", "new"):
        mod = copy.deepcopy(m)
        runners[name] = compiled(
            name, lambda: Runner(mod if name == "eager" else ember.compile(mod), mod, "train",
                                 args, kw),
            lambda r: [r.step() for _ in range(2)])     # compiles forward and backward
    s, _ = _timing.paired({k: r.step for k, r in runners.items()}, rounds=a.rounds, reps=1)
    print(f"{a.model} train, load {os.getloadavg()[0]:.1f}, {a.rounds} rounds; ms per step")
    print(report(a.model, s))

if __name__ == "__main__":
    main()
