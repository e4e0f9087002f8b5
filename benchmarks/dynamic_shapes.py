"""Dynamic shapes (#12): a GPT-2 small config (the bench suite's) fed varying sequence lengths.

1. Compile cost: first call at each of 10 sequence lengths, fresh caches, for ember (automatic
   dynamic) and torch.compile (inductor, its automatic dynamic) in the same process; prints the
   compiles each made and the total seconds spent in first calls.
2. Steady state: per-call time of the one dynamic ember graph vs a static ember compile made for
   that exact size (dynamic=False), paired alternating rounds, medians.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
        python benchmarks/dynamic_shapes.py [--no-torch] [--rounds 9]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

import torch

import ember

LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 160, 200)


def gpt2():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=1000, n_positions=256,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(cfg).eval()


def ids(batch, t):
    return torch.randint(0, 1000, (batch, t), generator=torch.Generator().manual_seed(t))


def first_calls(model, batch):
    """Seconds of the first call at each length (compile + run), and the reference check."""
    total = 0.0
    with torch.no_grad():
        for t in LENGTHS:
            x = ids(batch, t)
            t0 = time.perf_counter()
            model(input_ids=x)
            total += time.perf_counter() - t0
    return total


def timed(model, x, reps):
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(reps):
            model(input_ids=x)
        return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-dyn-"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-dyn-"))
    base = gpt2()
    print(f"threads={a.threads} MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_')} "
          f"lengths={LENGTHS} batch={a.batch} (cold caches for both compilers)")

    from ember.capture.entry import stats
    ember.reset()
    dyn = ember.compile(copy.deepcopy(base))
    sec = first_calls(dyn, a.batch)
    print(f"ember       first calls over {len(LENGTHS)} lengths: {sec:7.2f} s, "
          f"{stats().get('graphs', 0)} compiles")
    with torch.no_grad():
        for t in LENGTHS:
            torch.testing.assert_close(dyn(input_ids=ids(a.batch, t)).last_hidden_state,
                                       base(input_ids=ids(a.batch, t)).last_hidden_state,
                                       rtol=1e-4, atol=1e-4)
    if not a.no_torch:
        from torch import _dynamo
        _dynamo.reset()
        tc = torch.compile(copy.deepcopy(base))
        sec_t = first_calls(tc, a.batch)
        n = _dynamo.utils.counters["stats"]["unique_graphs"]
        print(f"torch.compile first calls over {len(LENGTHS)} lengths: {sec_t:7.2f} s, "
              f"{n} graphs   (ember/torch time ratio {sec / sec_t:.2f})")

    print("\nper call, dynamic graph vs a static compile for that size (paired medians):")
    print(f"{'seq':>5} {'dynamic ms':>11} {'static ms':>10} {'dyn/static':>11}")
    ratios = []
    for t in (16, 64, 200):
        x = ids(a.batch, t)
        static = ember.compile(copy.deepcopy(base), dynamic=False)
        timed(static, x, 2)
        timed(dyn, x, 2)
        d, s = [], []
        for r in range(a.rounds):
            pair = [(dyn, d), (static, s)]
            for m, out in (pair if r % 2 == 0 else pair[::-1]):
                out.append(timed(m, x, a.reps))
        md, ms = statistics.median(d) * 1e3, statistics.median(s) * 1e3
        ratios.append(md / ms)
        print(f"{t:>5} {md:>11.3f} {ms:>10.3f} {md / ms:>11.3f}")
    print(f"geomean dyn/static {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
