"""CPU kernel benchmark: eager vs torch.compile (inductor) vs ember, side by side in one process.

    .venv/bin/python benchmarks/cpu_kernels.py [--threads 2] [--rounds 15] [--only NAME,...]

Each case is timed in alternating rounds (eager, inductor, ember, eager, ...) and the median of
each is reported with speedups. ember runs as torch.compile(fn, backend=ember.get_backend("ember"))
so both compilers get Dynamo's capture and differ only in aot+kernels. The allocator is kept
from returning big buffers to the OS (the script re-executes itself with MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ set) and caches start empty (temporary dirs) for the cold compile times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.bench.hygiene import MALLOC_ENV as ENV  # noqa: E402


def pointwise_chain(x):
    y = x * 1.1 + 0.3
    y = torch.relu(y) - 0.5
    y = torch.sigmoid(y) * x
    y = torch.tanh(y) + x * 0.25
    y = y * y - 1.0
    return y


def ln_gelu_case():
    w, b = torch.randn(2048), torch.randn(2048)
    fn = lambda x: F.gelu(F.layer_norm(x, (2048,), w, b))  # noqa: E731
    return fn, (torch.randn(2048, 2048),)


def chain_case():
    return pointwise_chain, (torch.randn(2048, 2048),)


def softmax_case():
    return (lambda x: torch.softmax(x, -1)), (torch.randn(2048, 1024),)


def row_sum_case():
    return (lambda x: x.sum(-1)), (torch.randn(2048, 1024),)


def row_amax_case():
    return (lambda x: x.amax(-1)), (torch.randn(2048, 1024),)


def model_case(name, train=False):
    import torchvision
    torch.manual_seed(0)
    if name == "resnet18":
        m, x = torchvision.models.resnet18(), torch.randn(4, 3, 160, 160)
    elif name == "mobilenet_v2":
        m, x = torchvision.models.mobilenet_v2(), torch.randn(4, 3, 160, 160)
    elif name == "mlp":
        m = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.LayerNorm(1024), nn.Linear(1024, 1024),
                          nn.ReLU(), nn.Linear(1024, 10))
        x = torch.randn(256, 512)
    elif name == "transformer":
        m = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        x = torch.randn(8, 128, 256)
    else:
        raise ValueError(name)
    if not train:
        m.eval()

        def fn(inp):
            with torch.no_grad():
                return m(inp)
        return fn, (x,), m
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)

    def step_factory(mod):
        def step(inp):
            out = mod(inp)
            loss = out.float().pow(2).mean()
            loss.backward()
            return loss
        return step
    return step_factory, (x,), m


def bench(name, fns: dict, args, rounds, reps=None):
    for f in fns.values():   # warm up (first call compiles)
        f(*args)
        f(*args)
    samples, _ = _timing.paired(fns, args, rounds, reps)
    med = {k: statistics.median(v) for k, v in samples.items()}
    row = {"case": name, **{f"{k}_ms": med[k] * 1e3 for k in med}}
    row["ember_vs_eager"] = med["eager"] / med["ember"]
    row["ember_vs_inductor"] = med["inductor"] / med["ember"]
    row["inductor_vs_eager"] = med["eager"] / med["inductor"]
    return row


def compile_time(make, args):
    torch._dynamo.reset()
    f = make()
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    only = set(a.only.split(",")) if a.only else None
    backend = ember.get_backend("ember")
    rows = []

    kernel_cases = {"ln_gelu_2048": ln_gelu_case, "pointwise_chain_2048": chain_case,
                    "softmax_2048x1024": softmax_case, "row_sum_2048x1024": row_sum_case,
                    "row_amax_2048x1024": row_amax_case}
    for name, make in kernel_cases.items():
        if only and name not in only:
            continue
        fn, args = make()
        torch._dynamo.reset()
        fns = {"eager": fn, "inductor": torch.compile(fn), "ember": torch.compile(fn, backend=backend)}
        rows.append(bench(name, fns, args, a.rounds))
        print(json.dumps(rows[-1]), flush=True)

    for train in (False, True):
        for model in ("mlp", "resnet18", "mobilenet_v2", "transformer"):
            name = f"{model}_{'train' if train else 'infer'}"
            if only and name not in only and model not in only:
                continue
            torch._dynamo.reset()
            made = model_case(model, train)
            if not train:
                fn, args, m = made
                fns = {"eager": fn, "inductor": torch.compile(fn),
                       "ember": torch.compile(fn, backend=backend)}
            else:
                factory, args, m = made
                fns = {"eager": factory(m), "inductor": factory(torch.compile(m)),
                       "ember": factory(torch.compile(m, backend=backend))}
            t0 = time.perf_counter()
            fns["inductor"](*args)
            t_ind = time.perf_counter() - t0
            t0 = time.perf_counter()
            fns["ember"](*args)
            t_emb = time.perf_counter() - t0
            row = bench(name, fns, args, max(5, a.rounds // 2))
            row["cold_compile_s_inductor"], row["cold_compile_s_ember"] = t_ind, t_emb
            if not train:  # warm: caches on disk, in-process state dropped
                torch._dynamo.reset()
                fe = torch.compile(fn, backend=backend)
                t0 = time.perf_counter()
                fe(*args)
                row["warm_compile_s_ember"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)

    print(f"\n# threads={a.threads} rounds={a.rounds} torch={torch.__version__} "
          f"env={ENV} (medians of alternating rounds; machine shared)")
    print(f"{'case':26s} {'eager ms':>9s} {'inductor':>9s} {'ember':>9s} {'vs eager':>9s} {'vs ind':>8s}")
    for r in rows:
        print(f"{r['case']:26s} {r['eager_ms']:9.2f} {r['inductor_ms']:9.2f} {r['ember_ms']:9.2f} "
              f"{r['ember_vs_eager']:8.2f}x {r['ember_vs_inductor']:7.2f}x")
    inf = [r["ember_vs_eager"] for r in rows if r["case"].endswith("_infer")]
    if inf:
        print(f"inference geomean vs eager: {statistics.geometric_mean(inf):.2f}x")
    tr = [r["ember_vs_eager"] for r in rows if r["case"].endswith("_train")]
    if tr:
        print(f"training geomean vs eager: {statistics.geometric_mean(tr):.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
