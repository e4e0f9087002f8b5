"""Issue 28, hooks and vjp: graphs/breaks of torch.compile and ember, and a training step with a
full backward hook on every Linear (eager, ember, torch.compile; paired, alternating rounds).

Run from the repo root: python benchmarks/issue28_hooks.py
"""
from __future__ import annotations

import copy
import sys
import statistics
import warnings

from _timing import paired, prepare, ratio_stats

prepare()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._dynamo.testing import CompileCounter  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import ember  # noqa: E402

warnings.simplefilter("ignore")
torch.set_num_threads(1)
_mm = torch.nn.modules.module


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.lin2 = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, t):
        return self.lin2(self.lin(t).relu())


def counts(make, call):
    """(torch.compile frames, breaks), (ember graphs, breaks), "ember == eager / torch.compile ==
    eager"."""
    ref_obj, t_obj, e_obj = (torch.manual_seed(0), make())[1], (torch.manual_seed(0), make())[1], \
        (torch.manual_seed(0), make())[1]
    torch._dynamo.reset()
    counters.clear()
    cnt = CompileCounter()
    got_t = call(torch.compile(t_obj, backend=cnt))
    ember.reset()
    got = call(ember.compile(e_obj, backend="aot_eager"))
    st = ember.stats()["counts"]
    want = call(ref_obj)
    same = [len(g) == len(want) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g, want))
            for g in (got, got_t)]
    same = f"{same[0]} / {same[1]}"
    return (cnt.frame_count, sum(counters["graph_break"].values())), \
        (st.get("graphs", 0), st.get("graph_breaks", 0)), same


def with_bw_hooks():
    m = Net()
    m.log = []
    m.lin.register_full_backward_hook(lambda mod, gi, go: m.log.append(go[0].clone()))
    m.lin2.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2,))
    return m


def step(m):
    t = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
    m.log.clear()
    m(t).pow(2).sum().backward()
    return [t.grad, *m.log]


def uses_vjp(x):
    out, vjp_fn = torch.func.vjp(lambda a: a.sin() * a, x)
    return (out.cos() + vjp_fn(torch.ones_like(out))[0],)


def table():
    print("| feature | torch.compile frames / breaks | ember graphs / breaks | "
          "ember / torch.compile == eager |")
    print("|---|---|---|---|")
    tc, ec, same = counts(with_bw_hooks, step)
    print(f"| full backward hook + pre-hook on submodules | {tc[0]} / {tc[1]} | {ec[0]} / {ec[1]} "
          f"| {same} |")
    h = _mm.register_module_forward_hook(lambda mod, a, o: o * 2)
    try:
        def fwd(m):
            return [m(torch.ones(3, 4))]
        tc, ec, same = counts(Net, fwd)
        print(f"| global forward hook | {tc[0]} / {tc[1]} | {ec[0]} / {ec[1]} | {same} |")
    finally:
        h.remove()
    tc, ec, same = counts(lambda: uses_vjp, lambda f: f(torch.randn(5, generator=torch.Generator()
                                                                     .manual_seed(2))))
    print(f"| torch.func.vjp + vjp_fn in the frame | {tc[0]} / {tc[1]} | {ec[0]} / {ec[1]} | "
          f"{same} |")


def train_step_timing():
    torch.manual_seed(0)
    base = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(256, 256), nn.GELU())],
                         nn.Linear(256, 10))
    seen = []
    models = {}
    for kind in ("eager", "ember", "torch.compile"):
        m = copy.deepcopy(base)
        for sub in m:
            if isinstance(sub, nn.Linear):
                sub.register_full_backward_hook(lambda mod, gi, go: seen.append(go[0]))
        models[kind] = ember.compile(m) if kind == "ember" else \
            torch.compile(m) if kind == "torch.compile" else m
    x = torch.randn(64, 256)

    def run(m):
        m(x.clone().requires_grad_()).square().mean().backward()
        seen.clear()
    fns = {k: (lambda m=m: run(m)) for k, m in models.items()}
    for f in fns.values():         # compile and warm up
        for _ in range(5):
            f()
    samples, reps = paired(fns, rounds=15)
    print(f"\ntraining step, 4x Linear(256)+GELU, batch 64, a full backward hook on each Linear, "
          f"1 thread, {reps} steps x 15 rounds:")
    for k, v in samples.items():
        r = ratio_stats(samples["eager"], v)
        print(f"  {k:14s} median {statistics.median(v) * 1e3:.3f} ms  speed vs eager "
              f"{r['median']:.2f}x (per-round p25-p75 {r['p25']:.2f}-{r['p75']:.2f})")


if __name__ == "__main__":
    table()
    if "--no-timing" not in sys.argv:
        train_step_timing()
