"""Scans and softmax over each dim, eager vs ember, thread CPU time (docs/design/064).

    python benchmarks/scan_softmax_dims.py [--rounds 7] [--train]

One process, paired alternating rounds (_timing.paired), 1 thread, EMBER_SPEED_CHECK=0 is set
by the caller. Rows: cumsum over each dim of [B, T, D] and of NCHW, softmax / log_softmax over
each dim of an attention-score tensor and of NCHW. Prints eager ms, ember ms, eager/ember
(median of the per-round ratios [p25-p75])."""
import argparse

import _timing

_timing.prepare()

import torch  # noqa: E402

import ember  # noqa: E402

CASES = [
    ("cumsum", (8, 512, 768), 0), ("cumsum", (8, 512, 768), 1), ("cumsum", (8, 512, 768), 2),
    ("cumsum", (32, 64, 56, 56), 1), ("cumsum", (32, 64, 56, 56), 2), ("cumsum", (32, 64, 56, 56), 3),
    ("softmax", (8, 12, 128, 128), 1), ("softmax", (8, 12, 128, 128), 2),
    ("softmax", (8, 12, 128, 128), 3), ("softmax", (32, 64, 56, 56), 1),
    ("log_softmax", (8, 12, 128, 128), 2), ("log_softmax", (32, 64, 56, 56), 1),
    ("log_softmax", (8, 1000, 64), 1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--train", action="store_true", help="forward + backward")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for op, shape, dim in CASES:
        name = f"{op} {list(shape)} dim={dim}"
        if a.only not in name:
            continue
        ember.reset()       # one code object for every case: no recompile limit
        torch.manual_seed(0)
        x = torch.randn(*shape, requires_grad=a.train)
        g = torch.randn(*shape)
        fn = getattr(torch, op)

        def f(t, fn=fn, dim=dim):
            return fn(t, dim)
        c = ember.compile(f)

        def run(m):
            if a.train:
                x.grad = None
                m(x).backward(g)
            else:
                with torch.no_grad():
                    m(x)
        run(c)
        run(c)
        s, _ = _timing.paired({"eager": lambda: run(f), "ember": lambda: run(c)}, rounds=a.rounds)
        r = _timing.ratio_stats(s["eager"], s["ember"])
        med = lambda v: sorted(v)[len(v) // 2] * 1e3  # noqa: E731
        print(f"{name:42s} {'train' if a.train else 'infer'}  eager {med(s['eager']):8.3f} ms  "
              f"ember {med(s['ember']):8.3f} ms  {r['median']:5.2f}x [{r['p25']:.2f}-{r['p75']:.2f}]",
              flush=True)


if __name__ == "__main__":
    main()
