"""NCHW <-> NHWC conversions in float32, bfloat16, float16 and float64, eager vs ember, paired
in one process (docs/design/087): thread CPU time, 1 thread, alternating order; per case the
medians and the per-round ratio eager/ember, median [min-max]. Each result is checked against
eager bit for bit (values and strides) first.

    EMBER_SPEED_CHECK=0 PYTHONPATH=. python benchmarks/layout_dtypes.py [--rounds 5] [--only REGEX]

A/B of two trees: run it once per tree (a fresh EMBER_CACHE_DIR each, _timing.prepare).
"""
from __future__ import annotations

import argparse
import re
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402

import ember  # noqa: E402

SHAPES = [(8, 128, 28, 28), (8, 144, 56, 56), (4, 96, 55, 55)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


class ToChannelsLast(torch.nn.Module):
    def forward(self, x):
        return x.contiguous(memory_format=torch.channels_last)


class ToContiguous(torch.nn.Module):
    def forward(self, x):
        return x.contiguous()


def cases():
    for dt in DTYPES:
        for s in SHAPES:
            x = torch.randn(*s).to(dt)
            name = f"{str(dt).split('.')[1]}_{'x'.join(map(str, s))}"
            yield "nchw_to_nhwc_" + name, ToChannelsLast, x
            yield "nhwc_to_nchw_" + name, ToContiguous, x.contiguous(memory_format=torch.channels_last)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name, mod, x in cases():
        if not re.search(a.only, name):
            continue
        eager, compiled = mod(), ember.compile(mod())
        with torch.no_grad():
            want, got = eager(x), compiled(x)
            assert got.stride() == want.stride() and torch.equal(
                got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)), name
            t, _ = _timing.paired({"eager": eager, "ember": compiled}, (x,), a.rounds,
                                  target_s=0.03)
        r = _timing.ratio_stats(t["eager"], t["ember"])
        print(f"{name:34s} eager {statistics.median(t['eager']) * 1e3:.3f} ms  ember "
              f"{statistics.median(t['ember']) * 1e3:.3f} ms  eager/ember {r['median']:.2f} "
              f"[{r['min']:.2f}-{r['max']:.2f}]", flush=True)


if __name__ == "__main__":
    main()
