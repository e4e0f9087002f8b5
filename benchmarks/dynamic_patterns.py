"""Dynamic shapes (#23): patterns fed sizes not seen at compile time, eager vs ember vs Inductor.

Each row compiles at a first size, then a second (ember's and torch.compile's automatic dynamic
recompile the graph with symbolic sizes), then times sizes seen by neither compile: eager, ember's
dynamic graph, ember compiled for that exact size (dynamic=False, the static reference) and
torch.compile (dynamic=None, default: the same two-size warm-up). One thread, thread CPU time
(time.thread_time) per call, the callables alternating each round (A B C D, D C B A, ...),
medians. Ratios: eager / ember-dynamic (> 1: ember faster), ember-static / ember-dynamic
(< 1: the dynamic kernels cost that much), eager / torch.compile. Also counts ember's compiles.

    EMBER_SPEED_CHECK=0 python benchmarks/dynamic_patterns.py [--no-torch] [--only NAME,...]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from _timing import prepare

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(256)

    def forward(self, x):
        return self.ln(x)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 0.125, dim=-1)


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class Rope(nn.Module):
    def forward(self, q, cos, sin):
        h = q.shape[-1] // 2
        rot = torch.cat((-q[..., h:], q[..., :h]), dim=-1)
        return q * cos + rot * sin


class GeluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Head split, scaled scores, softmax, weighted sum, head merge (no sdpa)."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.h = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2) / math.sqrt(c // self.h)).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, t, c))


class HeadMerge(nn.Module):
    """levit's head merge: [B*H, N, D] bmm output -> [B, N, H*D] + hardswish."""

    def forward(self, x):
        bh, n, d = x.shape
        return F.hardswish(x.view(bh // 4, 4, n, d).permute(0, 2, 1, 3).reshape(bh // 4, n, 4 * d))


class ChannelShuffle(nn.Module):
    def forward(self, x):
        b, c, h, w = x.shape
        y = x.view(b, 4, c // 4, h, w).transpose(1, 2).reshape(b, c, h, w)
        return F.relu(y) + 1.0


class GroupNormSiLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(8, 64)

    def forward(self, x):
        return F.silu(self.gn(x))


class KVCat(nn.Module):
    """A dynamic KV cache append: cat along the sequence, then scores against a new query."""

    def forward(self, cache, new, q):
        k = torch.cat([cache, new], dim=2)
        return (q @ k.transpose(-1, -2)).softmax(-1)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        layers, c = [], 3
        for o in (32, 64, 64):
            layers += [nn.Conv2d(c, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]
            c = o
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def bert():
    import transformers
    cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=1024, vocab_size=1000,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = transformers.BertModel(cfg).eval()
    return lambda ids: m(input_ids=ids).last_hidden_state, m


def g(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


# name: (module factory, inputs(n), compile sizes (first, second), timed sizes)
PATTERNS = {
    "layernorm_T": (LayerNorm, lambda t: (g(8, t, 256),), (128, 160), (192, 97)),
    "softmax_T": (Softmax, lambda t: (g(2, 4, t, t),), (128, 160), (192, 97)),
    "rmsnorm_T": (RMSNorm, lambda t: (g(4, t, 512),), (128, 160), (192, 97)),
    "rope_T": (Rope, lambda t: (g(2, 8, t, 64), g(t, 64), g(t, 64)), (128, 160), (192, 97)),
    "gelu_mlp_T": (GeluMLP, lambda t: (g(4, t, 256),), (128, 160), (192, 97)),
    "attention_T": (Attention, lambda t: (g(2, t, 256),), (128, 160), (192, 97)),
    "head_merge_N": (HeadMerge, lambda n: (g(32, n, 32),), (196, 160), (256, 97)),
    # every size changes (a second model or layer through the same code object): symbolic
    # divisors in the head merge's and the shuffle's indices
    "head_merge_all": (HeadMerge, lambda n: (g(4 * (n // 49), n, 16 + 4 * (n // 49)),),
                       (196, 392), (294, 147)),
    "channel_shuffle_all": (ChannelShuffle, lambda c: (g(4, c, 4096 // c, 4096 // c),),
                            (64, 128), (32, 256)),
    "channel_shuffle_B": (ChannelShuffle, lambda b: (g(b, 64, 32, 32),), (8, 6), (5, 3)),
    "groupnorm_silu_B": (GroupNormSiLU, lambda b: (g(b, 64, 32, 32),), (8, 6), (5, 3)),
    "kv_cat_T": (KVCat, lambda t: (g(1, 8, t, 64), g(1, 8, 1, 64), g(1, 8, 1, 64)),
                 (128, 160), (192, 97)),
    "convnet_B": (ConvNet, lambda b: (g(b, 3, 32, 32),), (8, 6), (5, 3)),
    "bert_T": (bert, lambda t: (torch.randint(0, 1000, (2, t),
                                              generator=torch.Generator().manual_seed(t)),),
               (128, 160), (192, 97)),
}


def make(factory):
    torch.manual_seed(0)
    made = factory()
    if isinstance(made, tuple):
        return made
    made.eval()
    return made, made


def paired(fns, args, rounds, reps):
    """Per-call thread CPU seconds of each callable, alternating order per round; medians."""
    order = list(fns)
    out = {k: [] for k in order}
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            t0 = time.thread_time()
            for _ in range(reps):
                fns[k](*args)
            out[k].append((time.thread_time() - t0) / reps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    prepare()
    torch.set_num_threads(1)
    import ember
    from ember.capture.entry import stats
    names = [n for n in PATTERNS if not a.only or n in a.only.split(",")]
    print(f"threads=1 clock=thread_time rounds={a.rounds} torch={'no' if a.no_torch else 'yes'}")
    print(f"{'pattern':18} {'size':>5} {'eager ms':>9} {'dyn/eager':>9} {'dyn/static':>10} "
          f"{'torch/eager':>11}  compiles  max err")
    for name in names:
        factory, inputs, (s0, s1), timed = PATTERNS[name]
        ember.reset()
        torch._dynamo.reset()
        def fresh():
            return make(factory)[0]
        ref = fresh()
        with torch.no_grad():
            dyn_fn = ember.compile(fresh())
            before = stats().get("graphs", 0)
            for s in (s0, s1):
                dyn_fn(*inputs(s))
            tc = None
            if not a.no_torch:
                tc = torch.compile(fresh())
                for s in (s0, s1):
                    tc(*inputs(s))
            warm = stats().get("graphs", 0) - before
            for s in timed:
                x = inputs(s)
                n0 = stats().get("graphs", 0)
                got = dyn_fn(*x)
                warm += stats().get("graphs", 0) - n0
                err = (got - ref(*x)).abs().max().item()
                st = ember.compile(fresh(), dynamic=False)
                st(*x)
                fns = {"eager": ref, "dyn": dyn_fn, "static": st}
                if tc is not None:
                    fns["torch"] = tc
                for f in fns.values():
                    f(*x)
                t0 = time.thread_time()
                ref(*x)
                reps = max(1, min(50, int(0.03 / max(time.thread_time() - t0, 1e-5))))
                res = paired(fns, x, a.rounds, reps)
                med = {k: statistics.median(v) for k, v in res.items()}
                q = sorted(e / d for e, d in zip(res["eager"], res["dyn"]))
                tcol = f"{med['eager'] / med['torch']:11.2f}" if tc is not None else f"{'-':>11}"
                print(f"{name:18} {s:5d} {med['eager'] * 1e3:9.3f} {med['eager'] / med['dyn']:9.2f} "
                      f"{med['static'] / med['dyn']:10.2f} {tcol}  "
                      f"{warm:8d}  {err:.1e}  "
                      f"[eager/dyn {q[0]:.2f}-{q[-1]:.2f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
