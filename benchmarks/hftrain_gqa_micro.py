"""hftrain_gqa_micro.py: sdpa(enable_gqa=True, is_causal=True), 8 query / 2 key-value heads, D 64:
eager vs ember (fused kernel, unrepeated k/v) vs ember as before (sdpa decomposed: bmm + softmax),
inference and forward+backward, thread CPU ms, paired alternating, 1 thread."""
import time, statistics as st, sys
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
import ember
import ember.aot.tracer as tracer
from ember.aot.attention import cpu_sdpa

def f(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

def before(*a, enable_gqa=False, float_masks=None, **k):
    return None if enable_gqa else cpu_sdpa(*a, **k)

rounds = 9
for B, L in ((2, 256), (1, 1024)):
    for train in (False, True):
        ember.reset()
        q = torch.randn(B, 8, L, 64, requires_grad=train)
        k, v = [torch.randn(B, 2, L, 64, requires_grad=train) for _ in range(2)]
        g = torch.randn(B, 8, L, 64)
        new = ember.compile(f)
        fs = {"eager": f, "new": new}
        def step(fn):
            if train:
                torch.autograd.grad(fn(q, k, v), (q, k, v), g)
            else:
                with torch.no_grad():
                    fn(q, k, v)
        step(new)
        tracer.cpu_sdpa = before
        ember.reset()
        old = ember.compile(lambda a, b, c: f(a, b, c))
        step(old)
        tracer.cpu_sdpa = cpu_sdpa
        fs["old"] = old
        t = {n: [] for n in fs}
        for i in range(rounds):
            for n in (list(fs) if i % 2 == 0 else list(fs)[::-1]):
                c = time.thread_time(); step(fs[n]); t[n].append(time.thread_time() - c)
        med = {n: st.median(x) * 1e3 for n, x in t.items()}
        print("B %d L %4d %s: eager %.2f ms, ember %.2f, ember before %.2f; eager/ember %.2f, before/after %.2f"
              % (B, L, "train" if train else "infer", med["eager"], med["new"], med["old"],
                 med["eager"] / med["new"], med["old"] / med["new"]))
