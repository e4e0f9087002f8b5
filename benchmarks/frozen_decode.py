"""Greedy `generate()` of a small HF Llama / GPT-2 (ember.bench.decode's configs, random
weights, static KV cache so sizes are static and the graphs can be frozen): tokens/s of eager,
ember, ember frozen without and with MKL-packed linear weights (prepack.py), torch.compile.
Paired rounds (order rotated every round), medians, [min, max] of per-round ratios vs eager.

    python benchmarks/frozen_decode.py --models llama,gpt2 --threads 1 --reps 5
"""
import argparse
import copy
import statistics
import time

import torch

import ember
from ember.bench.decode import build

VARIANTS = {
    "eager": None,
    "ember": {},
    "frozen-noprepack": {"freeze": True, "prepack": False},
    "frozen": {"freeze": True},
    "torch.compile": "torch",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name in a.models.split(","):
        torch.manual_seed(0)
        base = build(name, a.layers, a.hidden, a.vocab, a.prompt + a.new_tokens + 8)
        for p in base.parameters():
            p.requires_grad_(False)
        prompt = torch.randint(1, a.vocab, (1, a.prompt))

        def generate(model):
            with torch.no_grad():
                return model.generate(prompt, max_new_tokens=a.new_tokens,
                                      min_new_tokens=a.new_tokens, do_sample=False,
                                      cache_implementation="static")

        models, ref = {}, None
        for v in a.variants.split(","):
            model = copy.deepcopy(base)
            opt = VARIANTS[v]
            if opt == "torch":
                model.compile()
            elif opt is not None:
                ember.compile(model, options=opt)
            t0 = time.perf_counter()
            out = generate(model)
            ref = out if ref is None else ref
            print(f"{name} {v}: first generate {time.perf_counter() - t0:.1f} s, tokens equal "
                  f"eager's: {bool(torch.equal(out, ref))}", flush=True)
            models[v] = model
        counts = ember.stats()["counts"]
        print(f"  ember counters: frozen_graphs {counts.get('frozen_graphs', 0)}, "
              f"prepacked_linears {counts.get('prepacked_linears', 0)}", flush=True)
        times = {v: [] for v in models}
        order = list(models)
        for r in range(a.reps):
            for v in order[r % len(order):] + order[:r % len(order)]:
                t0 = time.perf_counter()
                generate(models[v])
                times[v].append(time.perf_counter() - t0)
        for v, ts in times.items():
            ratios = [e / t for e, t in zip(times["eager"], ts)] if "eager" in times else [1]
            print(f"{name} {v:18s} {a.new_tokens / statistics.median(ts):7.1f} tokens/s "
                  f"(median of {a.reps}), vs eager {statistics.median(ratios):.2f}x "
                  f"[{min(ratios):.2f}, {max(ratios):.2f}]", flush=True)


if __name__ == "__main__":
    main()
