"""Eager vs ember (vs torch.compile) on LayerNorm over the channels of an NCHW tensor (ConvNeXt's
/ timm's LayerNorm2d: permute to NHWC, LayerNorm(C), permute back), inference or forward +
backward, 1 thread, CPU time of this thread per call, paired alternating rounds
(benchmarks/_timing.py); design 077.

    EMBER_SPEED_CHECK=0 python benchmarks/ln2d_micro.py [N,C,H,W ...] [--train] [--torch]
"""
import argparse
import statistics

import _timing

_timing.prepare()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402


class LN2d(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shapes", nargs="*", default=["8,96,56,56", "8,384,14,14", "8,64,56,56"])
    p.add_argument("--train", action="store_true")
    p.add_argument("--torch", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    for s in a.shapes:
        n, c, h, w = map(int, s.split(","))
        torch.manual_seed(0)
        m = LN2d(c)
        x = torch.randn(n, c, h, w, requires_grad=a.train)
        g = torch.randn(n, c, h, w)
        fns = {"eager": m, "ember": LN2d(c)}
        fns["ember"].load_state_dict(m.state_dict())
        ember.compile(fns["ember"], dynamic=False)   # one static graph per shape
        if a.torch:
            t = LN2d(c)
            t.load_state_dict(m.state_dict())
            fns["torch"] = torch.compile(t, dynamic=False)

        def step(f):
            if a.train:
                x.grad = None
                f(x).backward(g)
            else:
                with torch.no_grad():
                    f(x)
        for f in fns.values():
            step(f)
            step(f)
        samples, reps = _timing.paired({k: (lambda f=f: step(f)) for k, f in fns.items()},
                                       rounds=a.rounds)
        line = [f"ln2d_{n}x{c}x{h}x{w}", "train" if a.train else "infer"]
        for k in fns:
            line.append(f"{k} {statistics.median(samples[k]) * 1e3:.3f} ms")
        for k in list(fns)[1:]:
            r = _timing.ratio_stats(samples["eager"], samples[k])
            line.append(f"eager/{k} {r['median']:.2f} [{r['p25']:.2f}-{r['p75']:.2f}]")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
